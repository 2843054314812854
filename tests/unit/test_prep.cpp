// `dstrain prep` beyond the basics of test_data.cpp: documents larger than the memory limit
// come in segments and still encode as a whole, the number of threads does not change the
// corpus, and shuffling is a deterministic permutation of the documents of each split.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <random>

#include "dstrain/data/bpe_tokenizer.h"
#include "dstrain/data/byte_level.h"
#include "dstrain/data/corpus.h"
#include "dstrain/data/prep.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::TempDir;

namespace {

// GPT-2's pre-tokenizer over a byte vocabulary with a few English merges.
std::string small_gpt2_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  const auto& chars = byte_level::byte_to_chars();
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = b;
  int next = 256;
  for (auto [left, right] : std::vector<std::pair<std::string, std::string>>{
           {"t", "h"}, {"th", "e"}, {"Ġ", "the"}, {"Ġ", "a"}, {"i", "n"}, {"Ġ", "in"}, {"Ċ", "Ċ"}, {"e", "r"}}) {
    vocab[left + right] = next++;
    merges.push_back(left + " " + right);
  }
  nlohmann::json tokenizer = {
      {"added_tokens", {{{"id", next}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  return tokenizer.dump();
}

// Lines of words, some starting with white space or punctuation (where no cut may fall).
std::string generated_text(size_t bytes, uint32_t seed) {
  const std::vector<std::string> words = {"the", "a", "in", "other", "The", "río", "日本", "42", "--", "'s", "  ", "\t"};
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    if (rng() % 3 == 0) text += rng() % 2 ? " " : "(";
    for (int w = 0, n = 1 + rng() % 12; w < n; ++w) text += words[rng() % words.size()] + (rng() % 4 ? " " : "");
    text += rng() % 5 ? "\n" : "\n\n";
  }
  return text;
}

struct Corpus {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> offsets;
};

Corpus read_corpus(const std::string& path) {
  CorpusReader reader(path);
  Corpus corpus{std::vector<uint32_t>(reader.info().n_tokens), reader.read_doc_offsets()};
  reader.read(0, corpus.tokens.size(), corpus.tokens.data());
  return corpus;
}

std::vector<std::vector<uint32_t>> documents(const Corpus& corpus) {
  std::vector<std::vector<uint32_t>> docs;
  for (size_t d = 0; d + 1 < corpus.offsets.size(); ++d)
    docs.emplace_back(corpus.tokens.begin() + corpus.offsets[d], corpus.tokens.begin() + corpus.offsets[d + 1]);
  return docs;
}

}  // namespace

TEST(Prep, DocumentsLargerThanTheMemoryLimitEncodeAsAWhole) {
  TempDir dir;
  dir.write("tokenizer.json", small_gpt2_tokenizer());
  const std::string text = generated_text(3000000, 1);
  dir.write("big.txt", text);
  PrepOptions options;
  options.inputs = {dir.path("big.txt")};
  options.output = dir.path("big.h5");
  options.tokenizer = dir.path("tokenizer.json");
  options.threads = 2;
  options.memory_limit_mb = 16;  // batches of ~0.5 MB: the document comes in several segments
  run_prep(options);
  auto tokenizer = BpeTokenizer::from_file(dir.path("tokenizer.json"));
  std::vector<uint32_t> expected = tokenizer->encode(text);
  expected.push_back(tokenizer->eod_id());
  Corpus corpus = read_corpus(dir.path("big.h5"));
  EXPECT_EQ(corpus.offsets, (std::vector<uint64_t>{0, expected.size()}));
  EXPECT_TRUE(corpus.tokens == expected) << "segmented encoding differs from encoding the whole document";

  // A line break after other white space is no place to cut: GPT-2's pattern splits " \n\n"
  // before a word as " \n" and "\n", but at the end of a segment keeps it whole.
  std::string runs;
  while (runs.size() < 2000000) runs += "abc \n\nxyz\u3000\nlmn\n";
  dir.write("runs.txt", runs);
  options.inputs = {dir.path("runs.txt")};
  run_prep(options);
  expected = tokenizer->encode(runs);
  expected.push_back(tokenizer->eod_id());
  corpus = read_corpus(dir.path("big.h5"));
  EXPECT_TRUE(corpus.tokens == expected) << "segments cut inside a run of white space";

  // Without any line break there is no safe cut: the text still comes back byte for byte.
  std::string one_line = text;
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  dir.write("line.txt", one_line);
  options.inputs = {dir.path("line.txt")};
  run_prep(options);
  corpus = read_corpus(dir.path("big.h5"));
  ASSERT_EQ(corpus.tokens.back(), tokenizer->eod_id());
  corpus.tokens.pop_back();
  EXPECT_TRUE(tokenizer->decode(corpus.tokens) == one_line);
}

// A tokenizer whose post-processor puts a beginning token before every sequence (DeepSeek's):
// every document starts with it, also when it comes in several segments, and ends with the EOD.
TEST(Prep, DocumentsStartWithTheTokenizersBeginningToken) {
  TempDir dir;
  nlohmann::json tokenizer = nlohmann::json::parse(small_gpt2_tokenizer());
  const uint32_t bos = 300;
  tokenizer["added_tokens"].push_back({{"id", bos}, {"content", "<s>"}, {"special", true}});
  tokenizer["post_processor"] = {{"type", "TemplateProcessing"},
                                 {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  dir.write("tokenizer.json", tokenizer.dump());
  const std::string big = generated_text(2000000, 3);
  dir.write("docs.jsonl", nlohmann::json{{"text", "the cat"}}.dump() + "\n" + nlohmann::json{{"text", big}}.dump() +
                              "\n" + nlohmann::json{{"text", "in"}}.dump() + "\n");
  dir.write("big.txt", big);
  PrepOptions options;
  options.inputs = {dir.path("docs.jsonl"), dir.path("big.txt")};
  options.output = dir.path("out.h5");
  options.tokenizer = dir.path("tokenizer.json");
  options.memory_limit_mb = 16;  // big.txt comes in several segments
  run_prep(options);
  auto bpe = BpeTokenizer::from_file(dir.path("tokenizer.json"));
  ASSERT_EQ(bpe->bos_id(), std::optional<uint32_t>(bos));
  const std::vector<std::vector<uint32_t>> docs = documents(read_corpus(options.output));
  ASSERT_EQ(docs.size(), 4u);
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::string text = d == 0 ? "the cat" : d == 2 ? "in" : big;
    std::vector<uint32_t> expected = {bos};
    for (uint32_t id : bpe->encode(text)) expected.push_back(id);
    expected.push_back(bpe->eod_id());
    EXPECT_TRUE(docs[d] == expected) << "document " << d;
  }
}

TEST(Prep, ThreadsAndBatchSizesDoNotChangeTheCorpus) {
  TempDir dir;
  dir.write("tokenizer.json", small_gpt2_tokenizer());
  std::string lines;
  for (int i = 0; i < 3000; ++i)
    lines += nlohmann::json{{"text", generated_text(50 + i % 700, i)}}.dump() + "\n";
  dir.write("docs.jsonl", lines);
  dir.write("one.txt", generated_text(200000, 99));
  std::vector<Corpus> results;
  for (auto [threads, memory] : std::vector<std::pair<unsigned, uint64_t>>{{1, 1024}, {3, 16}, {2, 100}}) {
    PrepOptions options;
    options.inputs = {dir.path("docs.jsonl"), dir.path("one.txt"), dir.path("docs.jsonl")};
    options.output = dir.path("c" + std::to_string(threads) + ".h5");
    options.tokenizer = dir.path("tokenizer.json");
    options.threads = threads;
    options.memory_limit_mb = memory;
    PrepSummary summary = run_prep(options);
    EXPECT_EQ(summary.train.n_documents, 6001u);
    EXPECT_EQ(summary.threads, threads);
    results.push_back(read_corpus(options.output));
  }
  EXPECT_TRUE(results[0].tokens == results[1].tokens && results[0].offsets == results[1].offsets);
  EXPECT_TRUE(results[0].tokens == results[2].tokens && results[0].offsets == results[2].offsets);
}

TEST(Prep, ShuffleIsADeterministicPermutationOfEachSplit) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 200; ++i) lines += "{\"text\": \"document " + std::to_string(i) + "\"}\n";
  dir.write("docs.jsonl", lines);
  auto prep = [&](bool shuffle, uint64_t seed, const std::string& name) {
    PrepOptions options;
    options.inputs = {dir.path("docs.jsonl")};
    options.output = dir.path(name + ".h5");
    options.valid_fraction = 0.1;
    options.shuffle = shuffle;
    options.seed = seed;
    run_prep(options);
    return std::make_pair(documents(read_corpus(dir.path(name + ".h5"))), documents(read_corpus(dir.path(name + ".valid.h5"))));
  };
  auto plain = prep(false, 0, "plain"), first = prep(true, 1, "first"), again = prep(true, 1, "again"),
       other = prep(true, 2, "other");
  EXPECT_EQ(first, again);
  EXPECT_NE(first.first, other.first);
  EXPECT_NE(first.first, plain.first);
  EXPECT_NE(first.second, plain.second);
  for (auto* split : {&plain.first, &plain.second, &first.first, &first.second, &other.first}) std::sort(split->begin(), split->end());
  EXPECT_EQ(first.first, plain.first) << "the same training documents";
  EXPECT_EQ(first.second, plain.second) << "the same validation documents";
  EXPECT_EQ(other.first, plain.first);
  EXPECT_EQ(plain.second.size(), 20u);
}
