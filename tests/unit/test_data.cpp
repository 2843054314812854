#include <gtest/gtest.h>

#include <hdf5.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "dstrain/core/files.h"
#include "dstrain/data/corpus.h"
#include "dstrain/data/import.h"
#include "dstrain/data/loader.h"
#include "dstrain/data/prep.h"
#include "dstrain/data/sampler.h"
#include "dstrain/data/tokenizer.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;
using dstrain::test::TempDir;

TEST(Tokenizer, ByteTokenizerRoundTripsAnyBytes) {
  ByteTokenizer tokenizer;
  std::string text = "h\xc3\xa9llo \xff\xfe invalid UTF-8 \x00 and a NUL";
  text.push_back('\0');
  std::vector<uint32_t> ids = tokenizer.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[1], 0xc3u);
  EXPECT_EQ(tokenizer.decode(ids), text);
}

TEST(Prep, WritesACorpusThatReadsBackToTheSameTokens) {
  TempDir dir;
  dir.write("a.txt", "first document");
  dir.write("b.jsonl", "{\"text\": \"second\"}\n\n{\"text\": \"caf\\u00e9 third\", \"id\": 3}\n");
  PrepOptions options;
  options.inputs = {dir.path("a.txt"), dir.path("b.jsonl")};
  options.output = dir.path("corpus.h5");
  PrepSummary summary = run_prep(options);
  EXPECT_EQ(summary.train.n_documents, 3u);

  CorpusReader reader(dir.path("corpus.h5"));
  EXPECT_EQ(reader.info().tokenizer, "byte");
  EXPECT_EQ(reader.info().vocab_size, 257u);
  std::string expected_text[] = {"first document", "second", "caf\xc3\xa9 third"};
  std::vector<uint64_t> offsets = reader.read_doc_offsets();
  ASSERT_EQ(offsets.size(), 4u);
  std::vector<uint32_t> all(reader.info().n_tokens);
  reader.read(0, all.size(), all.data());
  ByteTokenizer tokenizer;
  for (int d = 0; d < 3; ++d) {
    std::vector<uint32_t> doc(all.begin() + offsets[d], all.begin() + offsets[d + 1]);
    ASSERT_EQ(doc.back(), 256u) << "documents end with the end-of-document token";
    doc.pop_back();
    EXPECT_EQ(tokenizer.decode(doc), expected_text[d]);
  }
  // A hyperslab in the middle.
  std::vector<uint32_t> middle(5);
  reader.read(offsets[1] + 1, 5, middle.data());
  EXPECT_EQ(tokenizer.decode(middle), "econd");
}

TEST(Prep, ValidationSplitTakesEveryKthDocument) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 20; ++i) lines += "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
  dir.write("docs.jsonl", lines);
  PrepOptions options;
  options.inputs = {dir.path("docs.jsonl")};
  options.output = dir.path("c.h5");
  options.valid_fraction = 0.25;
  PrepSummary summary = run_prep(options);
  EXPECT_EQ(summary.train.n_documents, 15u);
  EXPECT_EQ(summary.valid.n_documents, 5u);
  EXPECT_EQ(summary.valid.path, dir.path("c.valid.h5"));
  CorpusReader valid(dir.path("c.valid.h5"));
  std::vector<uint32_t> first(5);
  valid.read(0, 5, first.data());
  EXPECT_EQ(ByteTokenizer().decode(first), "doc 3");  // documents 3, 7, 11, 15, 19
}

TEST(Prep, BadInputsGiveClearErrorsAndLeaveNoCorpus) {
  TempDir dir;
  dir.write("bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": unquoted}\n");
  dir.write("notext.jsonl", "{\"body\": \"x\"}\n");
  dir.write("empty.txt", "");
  PrepOptions options;
  options.output = dir.path("out.h5");
  options.inputs = {dir.path("missing.txt")};
  expect_error([&] { run_prep(options); }, ExitCode::kData, {"missing.txt", "no such input file"});
  options.inputs = {dir.path("bad.jsonl")};
  expect_error([&] { run_prep(options); }, ExitCode::kData, {"bad.jsonl:2", "invalid JSON"});
  options.inputs = {dir.path("notext.jsonl")};
  expect_error([&] { run_prep(options); }, ExitCode::kData, {"notext.jsonl:1", "\"text\""});
  options.inputs = {dir.path("empty.txt")};
  expect_error([&] { run_prep(options); }, ExitCode::kData, {"empty"});
  options.inputs = {dir.path("")};  // the directory itself
  expect_error([&] { run_prep(options); }, ExitCode::kData, {"a directory; give the files in it"});
  // One document cannot give a validation split: no larger fraction exists than 0.5 to advise.
  dir.write("one.txt", "a single document");
  options.inputs = {dir.path("one.txt")};
  options.valid_fraction = 0.5;
  expect_error([&] { run_prep(options); }, ExitCode::kData,
               {"1 document(s) with --valid-fraction 0.5 (give more documents, or --valid-fraction 0 for none)"});
  options.valid_fraction = 0.3;  // nor would a larger one help a single document
  expect_error([&] { run_prep(options); }, ExitCode::kData,
               {"1 document(s) with --valid-fraction 0.3 (give more documents, or --valid-fraction 0 for none)"});
  EXPECT_FALSE(files::exists(dir.path("out.h5")));
  EXPECT_FALSE(files::exists(dir.path("out.h5.tmp")));
}

TEST(Corpus, UnreadableFilesNameTheFile) {
  TempDir dir;
  dir.write("text.h5", "this is not HDF5");
  expect_error([&] { CorpusReader reader(dir.path("text.h5")); }, ExitCode::kData,
               {"text.h5", "not an HDF5 file"});
  expect_error([&] { CorpusReader reader(dir.path("none.h5")); }, ExitCode::kData, {"none.h5"});
  // An HDF5 signature and nothing after it: a copy cut short.
  dir.write("cut.h5", std::string("\x89HDF\r\n\x1a\n", 8) + std::string(40, '\0'));
  expect_error([&] { CorpusReader reader(dir.path("cut.h5")); }, ExitCode::kData,
               {"cut.h5", "not a readable HDF5 file (truncated or damaged?)"});
}

TEST(Sampler, EpochPermutationIsADeterministicPermutation) {
  std::vector<uint64_t> a = epoch_permutation(1000, 5, 0);
  EXPECT_EQ(a, epoch_permutation(1000, 5, 0));
  EXPECT_NE(a, epoch_permutation(1000, 5, 1));
  EXPECT_NE(a, epoch_permutation(1000, 6, 0));
  std::vector<uint64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity);
}

TEST(Sampler, DataParallelRanksAreDisjointAndCoverTheEpoch) {
  const uint64_t n = 96;
  for (uint64_t dp : {1, 2, 3, 4}) {
    std::multiset<uint64_t> seen;
    GlobalSampler sampler(n, 11, true);
    const uint64_t micro = 2, accum = 4, steps = n / (micro * accum * dp);
    for (uint64_t rank = 0; rank < dp; ++rank) {
      BatchLayout layout{micro, accum, dp, rank};
      for (uint64_t step = 0; step < steps; ++step)
        for (uint64_t m = 0; m < accum; ++m)
          for (uint64_t row = 0; row < micro; ++row) seen.insert(sampler.sample_at(layout.position(step, m, row)));
    }
    EXPECT_EQ(seen.size(), n) << dp;
    EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), n) << "a sample seen twice, dp " << dp;
  }
  // The set of samples of a global batch does not depend on dp.
  GlobalSampler sampler(n, 11, true);
  std::set<uint64_t> one_rank, two_ranks;
  for (uint64_t row = 0; row < 8; ++row) one_rank.insert(sampler.sample_at(BatchLayout{8, 1, 1, 0}.position(3, 0, row)));
  for (uint64_t rank = 0; rank < 2; ++rank)
    for (uint64_t m = 0; m < 2; ++m)
      for (uint64_t row = 0; row < 2; ++row)
        two_ranks.insert(sampler.sample_at(BatchLayout{2, 2, 2, rank}.position(3, m, row)));
  EXPECT_EQ(one_rank, two_ranks);
}

namespace {

// A byte-tokenized corpus of `length` letters a, b, ..., z, a, ... (one document).
std::shared_ptr<CorpusReader> alphabet_corpus(TempDir& dir, int length) {
  std::string text;
  for (int i = 0; i < length; ++i) text.push_back(static_cast<char>('a' + i % 26));
  dir.write("t.txt", text);
  PrepOptions prep;
  prep.inputs = {dir.path("t.txt")};
  prep.output = dir.path("t.h5");
  run_prep(prep);
  return std::make_shared<CorpusReader>(dir.path("t.h5"));
}

}  // namespace

TEST(Loader, MicroBatchesAreTheSampledTokensAndTheStateResumes) {
  TempDir dir;
  auto corpus = alphabet_corpus(dir, 400);
  LoaderOptions options;
  options.seq_len = 8;
  options.layout = {2, 2, 2, 1};
  options.seed = 3;
  options.model_vocab = 257;
  DataLoader loader(corpus, options, 0);
  GlobalSampler sampler(samples_in_corpus(401, 8), 3, true);
  for (uint64_t step = 0; step < 3; ++step) {
    for (uint64_t m = 0; m < 2; ++m) {
      torch::Tensor batch = loader.next();
      ASSERT_EQ(batch.sizes(), (std::vector<int64_t>{2, 9}));
      for (uint64_t row = 0; row < 2; ++row) {
        uint64_t sample = sampler.sample_at(options.layout.position(step, m, row));
        for (uint64_t i = 0; i < 9; ++i) {
          uint64_t offset = sample * 8 + i;
          int64_t expected = offset < 400 ? 'a' + offset % 26 : 256;
          EXPECT_EQ(batch[row][i].item<int64_t>(), expected);
        }
      }
    }
  }
  EXPECT_EQ(loader.consumed_samples(), 3u * 8u);
  DataLoader resumed(corpus, options, 3 * 8);  // after 3 steps of 8 samples
  DataLoader continued(corpus, options, 0);
  for (int i = 0; i < 6; ++i) continued.next();
  EXPECT_TRUE(torch::equal(resumed.next(), continued.next()));
}

TEST(Loader, TokensOutsideTheVocabularyNameFileAndOffset) {
  TempDir dir;
  dir.write("t.txt", std::string(100, 'z'));  // 'z' = 122
  PrepOptions prep;
  prep.inputs = {dir.path("t.txt")};
  prep.output = dir.path("t.h5");
  run_prep(prep);
  LoaderOptions options;
  options.seq_len = 4;
  options.layout = {1, 1, 1, 0};
  options.model_vocab = 100;
  DataLoader loader(std::make_shared<CorpusReader>(dir.path("t.h5")), options, 0);
  expect_error([&] { loader.next(); }, ExitCode::kData, {"t.h5", "token 122 at offset", "model.vocab_size = 100"});
  options.layout = {64, 1, 1, 0};
  expect_error([&] { DataLoader small(std::make_shared<CorpusReader>(dir.path("t.h5")), options, 0); },
               ExitCode::kData, {"fewer than one global batch"});
}

// What training would trip on hours later, found before a job is queued: a token at or above the
// vocabulary size (data verify), and document offsets that go backwards (any reader).
TEST(Corpus, VerifyFindsTokensOutsideTheVocabularyAndOffsetsOutOfOrder) {
  TempDir dir;
  {
    CorpusWriter writer(dir.path("good.h5"), 100, 99, "test");
    writer.add_document({1, 2, 3});
    writer.add_document({4, 5});
    writer.close();
  }
  EXPECT_NE(verify_corpus(dir.path("good.h5")).find("7 tokens in 2 documents, every token below"), std::string::npos);
  {
    CorpusWriter writer(dir.path("bad-token.h5"), 100, 99, "test");
    writer.add_document({1, 2, 3});
    writer.add_document({4, 150});  // tokens 4 and 5 of the corpus: the second document
    writer.close();
  }
  expect_error([&] { verify_corpus(dir.path("bad-token.h5")); }, ExitCode::kData,
               {"bad-token.h5", "token 150 at position 5 (document 1)", "vocabulary size 100"});

  // Offsets 0, 8, 7 of 7 tokens: the second document would end before it starts.
  const std::string backwards = dir.path("backwards.h5");
  {
    CorpusWriter writer(backwards, 100, 99, "test");
    writer.add_document({1, 2, 3});
    writer.add_document({4, 5});
    writer.close();
  }
  const hid_t file = H5Fopen(backwards.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t offsets = H5Dopen2(file, "doc_offsets", H5P_DEFAULT);
  ASSERT_GE(offsets, 0);
  const uint64_t wrong[3] = {0, 8, 7};
  ASSERT_GE(H5Dwrite(offsets, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, wrong), 0);
  ASSERT_GE(H5Dclose(offsets), 0);
  ASSERT_GE(H5Fclose(file), 0);
  expect_error([&] { CorpusReader reader(backwards); }, ExitCode::kData,
               {"backwards.h5", "/doc_offsets[2] = 7 comes before the entry ahead of it (8)"});
}

// A JSONL line that is not JSON: its position, in words of our own, not the JSON library's.
TEST(Prep, InvalidJsonLinesSayWhereWithoutTheLibrarysWording) {
  TempDir dir;
  dir.write("bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": unquoted}\n");
  PrepOptions options;
  options.output = dir.path("out.h5");
  options.inputs = {dir.path("bad.jsonl")};
  try {
    run_prep(options);
    FAIL() << "an invalid line was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kData);
    const std::string message = e.what();
    EXPECT_NE(message.find("bad.jsonl:2: invalid JSON at column 1"), std::string::npos) << message;
    EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
  }
}

// A batch-size ramp-up (LoaderOptions::global_batch_after): each step takes the next global
// batch's samples after those consumed, its micro-batches per rank following from its size.
TEST(Loader, RampedStepsTakeTheSamplesAfterThoseConsumed) {
  TempDir dir;
  auto corpus = alphabet_corpus(dir, 800);
  LoaderOptions options;
  options.seq_len = 8;
  options.layout = {1, 4, 2, 1};  // micro-batch 1, dp rank 1 of 2; the full batch 8
  options.seed = 5;
  options.model_vocab = 257;
  options.global_batch_after = [](uint64_t consumed) { return consumed < 8 ? uint64_t{2} : uint64_t{8}; };
  DataLoader loader(corpus, options, 0);
  GlobalSampler sampler(samples_in_corpus(801, 8), 5, true);
  // Steps of 2, 2, 2, 2 (8 samples), then 8: rank 1 takes the second half of each.
  struct Expected {
    uint64_t first, accum;
  };
  std::vector<Expected> steps = {{0, 1}, {2, 1}, {4, 1}, {6, 1}, {8, 4}, {16, 4}};
  for (const Expected& step : steps)
    for (uint64_t m = 0; m < step.accum; ++m) {
      const torch::Tensor batch = loader.next();
      const uint64_t sample = sampler.sample_at(step.first + 1 * 1 * step.accum + m);
      EXPECT_EQ(batch[0][0].item<int64_t>(), sample * 8 < 800 ? 'a' + static_cast<int64_t>(sample * 8 % 26) : 256)
          << "step starting at " << step.first;
    }
  EXPECT_EQ(loader.consumed_samples(), 24u);
}
