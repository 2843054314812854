// dstrain bench runs end to end and reports what it measured (the figures themselves are for
// people: bench/RESULTS.md; nothing here is timed).
#include <gtest/gtest.h>

#include "dstrain/core/files.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

// bench io on 2 ranks: reads the corpus, writes one checkpoint the way training does, removes it.
TEST(Bench, IoReadsTheCorpusAndWritesACheckpoint) {
  const std::string dir = scratch_dir("bench-io");
  RunOutput run = run_dstrain(2, {"bench", "io", "--data.train", test_corpus().train, "--ckpt.dir", dir + "/ckpt",
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
  EXPECT_NE(run.output.find("checkpoint of step 1: " + dir + "/ckpt/bench-io/step_00000001.h5"), std::string::npos)
      << run.output;
  EXPECT_FALSE(dstrain::files::exists(dir + "/ckpt/bench-io"));  // nothing left behind
}
