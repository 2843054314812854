// dstrain bench runs end to end and reports what it measured (the figures themselves are for
// people: bench/RESULTS.md; nothing here is timed).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dstrain/core/files.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

// bench io on 2 ranks: reads the corpus, writes one checkpoint the way training does (under
// ckpt.dir, by default RUN_DIR/checkpoints), removes it and the directories it made.
TEST(Bench, IoReadsTheCorpusAndWritesACheckpoint) {
  const std::string dir = scratch_dir("bench-io");
  RunOutput run = run_dstrain(2, {"bench", "io", "--data.train", test_corpus().train, "--run.dir", dir + "/run",
                                  "--bench.ckpt_mb", "32", "--bench.samples", "100", "--bench.json", dir + "/io.json"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json result = read_json(dir + "/io.json");
  ASSERT_EQ(result["results"].size(), 3u);
  const nlohmann::json& write = result["results"][2];
  EXPECT_EQ(write["write"], "checkpoint");
  EXPECT_EQ(write["bytes"].get<double>(), 32.0 * (1 << 20));
  EXPECT_EQ(write["ranks"], 2);
  EXPECT_GT(write["mbps"].get<double>(), 0.0);
  EXPECT_LE(write["blocked_seconds"].get<double>(), write["seconds"].get<double>());
  EXPECT_NE(run.output.find("checkpoint of step 1: " + dir + "/run/checkpoints/bench-io/step_00000001.h5"),
            std::string::npos)
      << run.output;
  // Nothing left behind, not even the directories it made for it.
  EXPECT_FALSE(dstrain::files::exists(dir + "/run")) << run.output;
}

// The directory it would write in and remove afterwards is refused when it exists already, and
// left as it was.
TEST(Bench, IoRefusesADirectoryThatIsNotItsOwn) {
  const std::string dir = scratch_dir("bench-io-existing");
  std::string why;
  ASSERT_TRUE(dstrain::files::make_directories(dir + "/ckpt/bench-io", &why)) << why;
  { std::ofstream(dir + "/ckpt/bench-io/keep.txt") << "mine\n"; }
  RunOutput run = run_dstrain(2, {"bench", "io", "--data.train", test_corpus().train, "--ckpt.dir", dir + "/ckpt",
                                  "--bench.ckpt_mb", "16", "--bench.samples", "10"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("ckpt.dir = " + dir + "/ckpt: " + dir + "/ckpt/bench-io exists already"), std::string::npos)
      << run.output;
  EXPECT_TRUE(dstrain::files::is_regular_file(dir + "/ckpt/bench-io/keep.txt"));
}

// bench step on 2 ranks on the CPU: trains the configured model on random tokens and reports
// its figures, the model's size and FLOPs among them, and the process's peak memory; it leaves
// no run behind and names none.
TEST(Bench, StepTrainsOnRandomTokensAndReportsItsFigures) {
  const std::string dir = scratch_dir("bench-step");
  RunOutput run = run_dstrain(2, {"bench", "step", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini",
                                  "--train.device", "cpu", "--bench.steps", "2", "--bench.json", dir + "/step.json"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json result = read_json(dir + "/step.json");
  EXPECT_EQ(result["bench"], "step");
  EXPECT_EQ(result["ranks"], 2);
  EXPECT_EQ(result["cuda_kernels"], false);  // on the CPU, LibTorch's operations whatever was built
  EXPECT_GT(result["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(result["params"].get<double>(), 0.0);
  EXPECT_GT(result["flops_per_token"].get<double>(), 6.0 * result["params"].get<double>() * 0.5);
  // Random tokens: the loss starts near log(vocabulary) and is finite.
  EXPECT_GT(result["final_loss"].get<double>(), 1.0);
  // The process's resident peak: LibTorch alone is tens of MB; far below the machine's memory.
  EXPECT_GT(result["peak_memory_bytes"].get<double>(), 20.0 * (1 << 20));
  EXPECT_LT(result["peak_memory_bytes"].get<double>(), 16.0 * (1LL << 30));
  EXPECT_NE(run.output.find("peak memory"), std::string::npos) << run.output;
  // Its run directory is temporary, gone when it ends: not pointed to.
  EXPECT_EQ(run.output.find("metrics: "), std::string::npos) << run.output;
}

// bench step --bench.profile on 2 ranks on the CPU: each rank writes its table and its Chrome
// trace; the table has the step's model parts (the MLP, the attention, the norms, the loss, the
// optimizer, the gradients' reduction) and their shares add up to the whole.
TEST(Bench, StepProfileAttributesTheStepToTheModelsParts) {
  const std::string dir = scratch_dir("bench-profile");
  RunOutput run = run_dstrain(2, {"bench", "step", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini",
                                  "--train.device", "cpu", "--bench.warmup", "1", "--bench.steps", "2",
                                  "--bench.profile", dir + "/profile"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("profile of steps 2 to 3"), std::string::npos) << run.output;
  for (const std::string& prefix : {dir + "/profile", dir + "/profile.rank1"}) {
    std::ifstream in(prefix + ".md");
    const std::string table((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    double shares = 0;
    for (const std::string part : {"mlp", "attention", "norm", "loss", "optimizer", "communication", "embedding"}) {
      const size_t row = table.find("| " + part + " | ");
      ASSERT_NE(row, std::string::npos) << part << " in " << table;
      const size_t share = table.find(" | ", row + part.size() + 4) + 3;
      shares += std::stod(table.substr(share));
    }
    const size_t other = table.find("| other | ");
    if (other != std::string::npos) shares += std::stod(table.substr(table.find(" | ", other + 9) + 3));
    EXPECT_NEAR(shares, 100.0, 0.5) << table;
    const nlohmann::json trace = read_json(prefix + ".trace.json");
    EXPECT_GT(trace["traceEvents"].size(), 100u);
  }
}

// bench comm on 2 and 4 ranks on the CPU: each collective at each size, all-to-all among them, its
// bus bandwidth nccl-tests' (n − 1)/n of the algorithm bandwidth, which is the size over the time.
TEST(Bench, CommMeasuresAllToAllWithTheOtherCollectives) {
  for (int ranks : {2, 4}) {
    const std::string dir = scratch_dir("bench-comm-" + std::to_string(ranks));
    RunOutput run = run_dstrain(ranks, {"bench", "comm", "--train.device", "cpu", "--bench.min_bytes", "4096",
                                        "--bench.max_bytes", "65536", "--bench.iters", "3", "--bench.json",
                                        dir + "/comm.json"});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const nlohmann::json result = read_json(dir + "/comm.json");
    EXPECT_EQ(result["ranks"], ranks);
    ASSERT_EQ(result["results"].size(), 3u * 4u);  // 4, 16 and 64 KiB; four collectives
    std::vector<double> sizes;
    for (const nlohmann::json& row : result["results"]) {
      if (row["op"] != "all_to_all") continue;
      const double bytes = row["bytes"].get<double>(), seconds = row["seconds"].get<double>();
      sizes.push_back(bytes);
      EXPECT_GT(seconds, 0.0);
      EXPECT_LT(seconds, 5.0) << "a few KiB between processes on one machine";
      EXPECT_NEAR(row["algbw_gbps"].get<double>(), bytes / seconds / 1e9, 1e-9 * bytes / seconds);
      EXPECT_NEAR(row["busbw_gbps"].get<double>(), row["algbw_gbps"].get<double>() * (ranks - 1) / ranks, 1e-12);
    }
    EXPECT_EQ(sizes, (std::vector<double>{4096, 16384, 65536}));
    size_t lines = 0;
    for (size_t at = run.output.find(" all_to_all "); at != std::string::npos; at = run.output.find(" all_to_all ", at + 1))
      ++lines;
    EXPECT_EQ(lines, 3u) << run.output;
  }
}
