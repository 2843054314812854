// `dstrain prep` as users run it: several MPI ranks give the corpus of one process, an input
// much larger than --memory-limit goes through in bounded memory, and bad options are refused
// before anything is written.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "dstrain/core/files.h"
#include "dstrain/data/corpus.h"
#include "e2e_util.h"

using namespace dstrain;
using namespace dstrain::e2e;

namespace {

struct Tokens {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> offsets;
  bool operator==(const Tokens& other) const { return tokens == other.tokens && offsets == other.offsets; }
};

Tokens read_all(const std::string& path) {
  CorpusReader reader(path);
  Tokens t{std::vector<uint32_t>(reader.info().n_tokens), reader.read_doc_offsets()};
  reader.read(0, t.tokens.size(), t.tokens.data());
  return t;
}

// Runs dstrain directly and returns its exit code and peak resident memory (KB).
std::pair<int, long> run_measured(const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(DSTRAIN_EXE)};
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    if (!freopen("/dev/null", "w", stdout)) _exit(127);
    execv(DSTRAIN_EXE, argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, usage.ru_maxrss};
}

}  // namespace

TEST(Prep, BadOptionsAreRefusedWithoutTouchingTheInput) {
  const std::string dir = scratch_dir("prep-bad-options");
  const std::string text = dir + "/notes.txt";
  std::ofstream(text) << "a few words to tokenize\n";
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--input", text, "--output", text}, 2, "--output = " + text + ": is also an input file"},
      {{"--input", text, "--output", dir + "/out.h5", "--valid-fraction", "0.1", "--valid-output", text}, 2,
       "--valid-output = " + text + ": is also an input file"},
      {{"--input", text, "--output", dir + "/out.h5", "--threads", "-1"}, 2, "--threads = -1: 0 (one per core) to 1024"},
      // Boost read a negative number for an unsigned option as its largest value.
      {{"--input", text, "--output", dir + "/out.h5", "--memory-limit", "-1"}, 2, "--memory-limit = -1: 16 to 2^40 (MB)"},
      {{"--input", text, "--output", dir + "/out.h5", "--seed", "-3"}, 2, "--seed = -3: 0 or more"},
      {{"--input", test_corpus().train, "--output", dir + "/out.h5"}, 3,
       test_corpus().train + ": an HDF5 file (a corpus?), not text or JSONL to tokenize"},
      {{"--inpu", text, "--output", dir + "/out.h5"}, 2, "unrecognised option '--inpu'"},
      // A word that is no option's value is refused, not dropped.
      {{"--output", dir + "/out.h5", "--input", text, "--shuffle", "more.txt"}, 2, "prep: unexpected argument 'more.txt'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"prep"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    RunOutput run = run_dstrain(0, args);
    EXPECT_EQ(run.exit_code, c.exit_code) << run.output;
    EXPECT_NE(run.output.find(c.expected), std::string::npos) << "expected \"" << c.expected << "\" in:\n" << run.output;
    EXPECT_FALSE(dstrain::files::exists(dir + "/out.h5"));
  }
  EXPECT_EQ(read_text(text), "a few words to tokenize\n");

  // Missing directories of the outputs are made (docs/data.md's data/my.h5 on a fresh checkout),
  // and removed again when prep fails.
  const std::string bad = dir + "/bad.jsonl";
  std::ofstream(bad) << "{\"text\": \"fine\"}\nnot json\n";
  RunOutput failed = run_dstrain(0, {"prep", "--input", bad, "--output", dir + "/fresh/data/out.h5"});
  EXPECT_EQ(failed.exit_code, 3) << failed.output;
  EXPECT_NE(failed.output.find(bad + ":2: invalid JSON"), std::string::npos) << failed.output;
  EXPECT_FALSE(dstrain::files::exists(dir + "/fresh"));
  std::ofstream(text + ".copy") << "more words\n";
  RunOutput made = run_dstrain(0, {"prep", "--input", text, text + ".copy", "--output", dir + "/fresh/data/out.h5",
                                   "--valid-fraction", "0.5", "--valid-output", dir + "/fresh/valid/out.h5"});
  EXPECT_EQ(made.exit_code, 0) << made.output;
  EXPECT_TRUE(dstrain::files::is_regular_file(dir + "/fresh/data/out.h5"));
  EXPECT_TRUE(dstrain::files::is_regular_file(dir + "/fresh/valid/out.h5"));
}

TEST(Prep, MpiRanksGiveTheCorpusOfOneProcess) {
  const std::string dir = scratch_dir("prep-ranks");
  std::vector<std::string> inputs;
  for (const char* name : {"GPL-2", "GPL-3", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "Artistic", "GFDL-1.3"})
    inputs.push_back(std::string("/usr/share/common-licenses/") + name);
  std::ofstream(dir + "/docs.jsonl") << "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"text\": \"three\"}\n";
  inputs.push_back(dir + "/docs.jsonl");
  auto prep = [&](int ranks, const std::string& name) {
    std::vector<std::string> args = {"prep", "--output", dir + "/" + name + ".h5", "--valid-fraction", "0.2",
                                     "--shuffle", "--seed", "5", "--threads", "1", "--input"};
    args.insert(args.end(), inputs.begin(), inputs.end());
    RunOutput out = run_dstrain(ranks, args);
    EXPECT_EQ(out.exit_code, 0) << out.output;
    return out;
  };
  prep(0, "one");
  RunOutput three = prep(3, "three");
  EXPECT_NE(three.output.find("1 threads x 3 processes"), std::string::npos) << three.output;
  EXPECT_TRUE(read_all(dir + "/one.h5") == read_all(dir + "/three.h5"));
  EXPECT_TRUE(read_all(dir + "/one.valid.h5") == read_all(dir + "/three.valid.h5"));
  EXPECT_EQ(read_all(dir + "/three.h5").offsets.size() + read_all(dir + "/three.valid.h5").offsets.size(), 10u + 2u);
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(std::ifstream(dir + "/three.h5.part-" + std::to_string(r)).good());

  // A bad input on one rank: one clear message, the data exit code, no corpus.
  inputs.back() = dir + "/bad.jsonl";
  std::ofstream(dir + "/bad.jsonl") << "{\"text\": \"fine\"}\nnot json\n";
  std::vector<std::string> args = {"prep", "--output", dir + "/bad.h5", "--input"};
  args.insert(args.end(), inputs.begin(), inputs.end());
  RunOutput bad = run_dstrain(3, args);
  EXPECT_EQ(bad.exit_code, 3) << bad.output;
  EXPECT_NE(bad.output.find("bad.jsonl:2: invalid JSON"), std::string::npos) << bad.output;
  EXPECT_FALSE(std::ifstream(dir + "/bad.h5").good());
}

TEST(Prep, InputLargerThanTheMemoryLimitStreamsThroughBoundedMemory) {
  const std::string dir = scratch_dir("prep-memory");
  // 160 MB of text in one document and a JSONL file; the byte tokenizer makes 4 bytes of token
  // out of each byte of text in flight, the worst case.
  std::string line;
  for (int i = 0; i < 20; ++i) line += "word" + std::to_string(i) + " ";
  line += "\n";
  {
    std::ofstream big(dir + "/big.txt", std::ios::binary);
    for (size_t written = 0; written < 120000000; written += line.size()) big << line;
    std::ofstream jsonl(dir + "/docs.jsonl", std::ios::binary);
    for (size_t written = 0; written < 40000000; written += line.size() + 14) jsonl << "{\"text\": \"" << line.substr(0, line.size() - 1) << "\"}\n";
    std::ofstream(dir + "/small.txt", std::ios::binary) << line;
  }
  auto [small_code, small_kb] = run_measured({"prep", "--input", dir + "/small.txt", "--output", dir + "/small.h5",
                                              "--memory-limit", "16", "--threads", "2"});
  ASSERT_EQ(small_code, 0);
  auto [big_code, big_kb] = run_measured({"prep", "--input", dir + "/big.txt", dir + "/docs.jsonl", "--output",
                                          dir + "/big.h5", "--memory-limit", "16", "--threads", "2"});
  ASSERT_EQ(big_code, 0);
  // The same process on 1 line of text and on 160 MB: the difference is what streaming costs.
  EXPECT_LT(big_kb - small_kb, 64 * 1024) << "peak " << big_kb << " KB against " << small_kb << " KB for one line";
  CorpusReader corpus(dir + "/big.h5");
  std::ifstream big(dir + "/big.txt", std::ios::binary | std::ios::ate);
  const uint64_t big_bytes = static_cast<uint64_t>(big.tellg());
  EXPECT_EQ(corpus.read_doc_offsets()[1], big_bytes + 1) << "the large text file is one document";
  // Tokens in the middle of the large document are its bytes.
  std::vector<uint32_t> middle(line.size());
  const uint64_t at = (big_bytes / 2 / line.size()) * line.size();
  corpus.read(at, middle.size(), middle.data());
  EXPECT_EQ(std::string(middle.begin(), middle.end()), line);
}

TEST(DataCommand, ImportsAnLlmcShardAndInspectsEveryKind) {
  const std::string dir = scratch_dir("data-command");
  // An llm.c shard (version 1) of two documents: EOT 50256 before each.
  std::vector<int32_t> header(256, 0);
  const std::vector<uint16_t> tokens = {50256, 10, 20, 30, 50256, 40, 50};
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  {
    std::ofstream shard(dir + "/shard.bin", std::ios::binary);
    shard.write(reinterpret_cast<const char*>(header.data()), 1024);
    shard.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  }
  RunOutput imported = run_dstrain(0, {"data", "import", "--format", "llmc", "--input", dir + "/shard.bin",
                                       "--output", dir + "/c.h5"});
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  EXPECT_NE(imported.output.find("2 documents, 7 tokens"), std::string::npos) << imported.output;
  RunOutput corpus = run_dstrain(0, {"data", "inspect", dir + "/c.h5", "--tokens", "7"});
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  EXPECT_NE(corpus.output.find("first tokens: 10 20 30 50256 40 50 50256"), std::string::npos) << corpus.output;
  RunOutput verified = run_dstrain(0, {"data", "verify", dir + "/c.h5"});
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_NE(verified.output.find("7 tokens in 2 documents, every token below the vocabulary size 50257"),
            std::string::npos)
      << verified.output;
  RunOutput shard = run_dstrain(0, {"data", "inspect", dir + "/shard.bin"});
  EXPECT_EQ(shard.exit_code, 0) << shard.output;
  EXPECT_NE(shard.output.find("llm.c token shard, version 1 (uint16 tokens), 7 tokens"), std::string::npos) << shard.output;
  std::ofstream(dir + "/notes.txt") << "just text";
  RunOutput unknown = run_dstrain(0, {"data", "inspect", dir + "/notes.txt"});
  EXPECT_EQ(unknown.exit_code, 3) << unknown.output;
  EXPECT_NE(unknown.output.find("notes.txt: not a corpus dstrain knows"), std::string::npos) << unknown.output;
  RunOutput usage = run_dstrain(0, {"data", "import", "--format", "llmc", "--output", dir + "/x.h5"});
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
}
