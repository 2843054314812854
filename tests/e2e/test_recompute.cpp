// Activation recomputation (train.recompute, selective and full) on real mpirun ranks: the same
// numbers as keeping every activation, bitwise (losses, gradient norms, evaluation, final
// parameters), for the dense and the DeepSeek-V3-shaped tiny models on one rank and on dp 2 ×
// pp 2; and less activation memory, as the run measures it.
#include <gtest/gtest.h>

#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

RunOutput train(const std::string& config, int ranks, const std::string& run_dir, std::vector<std::string> extra) {
  std::vector<std::string> args = {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/" + config,
                                   "--run.dir", run_dir, "--data.train", test_corpus().train, "--data.valid",
                                   test_corpus().valid, "--train.steps", "6", "--train.eval_interval", "3",
                                   "--train.micro_batch", "1", "--train.global_batch", "4"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_dstrain(ranks, args);
}

// Every number of every record but those of the clock.
void expect_same_records(const std::string& a, const std::string& b) {
  const auto x = read_jsonl(a + "/metrics.jsonl"), y = read_jsonl(b + "/metrics.jsonl");
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i)
    for (const char* key : {"loss", "mtp_loss", "balance_loss", "grad_norm", "lr", "eval_loss",
                            "expert_load_max_over_mean"}) {
      ASSERT_EQ(x[i].contains(key), y[i].contains(key)) << key;
      if (x[i].contains(key)) EXPECT_EQ(x[i][key], y[i][key]) << key << " of record " << i;
    }
  EXPECT_EQ(read_json(a + "/summary.json")["param_digest"], read_json(b + "/summary.json")["param_digest"]);
}

int64_t activation_bytes(const std::string& run_dir) {
  return read_json(run_dir + "/summary.json")["peak_activation_bytes"].get<int64_t>();
}

void check_model(const std::string& config, const std::string& name) {
  for (const auto& [ranks, layout] : {std::pair<int, std::vector<std::string>>{1, {}},
                                      std::pair<int, std::vector<std::string>>{4, {"--parallel.pp", "2"}}}) {
    const std::string kept = scratch_dir(name + "-none-" + std::to_string(ranks));
    const std::string rerun = scratch_dir(name + "-full-" + std::to_string(ranks));
    const std::string some = scratch_dir(name + "-selective-" + std::to_string(ranks));
    RunOutput none = train(config, ranks, kept, layout);
    ASSERT_EQ(none.exit_code, 0) << none.output;
    for (const auto& [mode, dir] : {std::pair{"selective", some}, std::pair{"full", rerun}}) {
      std::vector<std::string> args = layout;
      args.insert(args.end(), {"--train.recompute", mode});
      RunOutput run = train(config, ranks, dir, args);
      ASSERT_EQ(run.exit_code, 0) << run.output;
      expect_same_records(kept, dir);
    }
    // Full keeps each layer's input alone, selective the inputs of what it reruns: less than
    // keeping everything, and full the least.
    EXPECT_GT(activation_bytes(kept), 0);
    EXPECT_LT(activation_bytes(some), activation_bytes(kept)) << config << " on " << ranks << " rank(s)";
    EXPECT_LT(activation_bytes(rerun), activation_bytes(some)) << config << " on " << ranks << " rank(s)";
  }
}

}  // namespace

TEST(Recompute, EveryModeGivesTheSameNumbersWithLessMemoryDense) { check_model("tiny.ini", "recompute-dense"); }

TEST(Recompute, EveryModeGivesTheSameNumbersWithLessMemoryDeepSeekV3) { check_model("tiny-v3.ini", "recompute-v3"); }

// Only the first N layers of each chunk rerun: the same numbers, memory in between.
TEST(Recompute, SomeLayersOnly) {
  const std::string none = scratch_dir("recompute-layers-none"), one = scratch_dir("recompute-layers-1"),
                    all = scratch_dir("recompute-layers-all");
  ASSERT_EQ(train("tiny-v3.ini", 1, none, {}).exit_code, 0);
  RunOutput first = train("tiny-v3.ini", 1, one, {"--train.recompute", "full", "--train.recompute_layers", "1"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(train("tiny-v3.ini", 1, all, {"--train.recompute", "full"}).exit_code, 0);
  expect_same_records(none, one);
  EXPECT_LT(activation_bytes(one), activation_bytes(none));
  EXPECT_GT(activation_bytes(one), activation_bytes(all));
}

TEST(Recompute, AnUnknownModeIsAUsageError) {
  RunOutput run = train("tiny.ini", 0, scratch_dir("recompute-bad"), {"--train.recompute", "everything"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("train.recompute"), std::string::npos) << run.output;
  // A layer count means something for full recomputation only.
  run = train("tiny.ini", 0, scratch_dir("recompute-bad-layers"),
              {"--train.recompute", "selective", "--train.recompute_layers", "2"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("train.recompute_layers"), std::string::npos) << run.output;
}

// A layer count beyond every chunk's layers recomputes them all, as 0 does, and the run says so.
TEST(Recompute, ACountBeyondTheLayersIsSaidToMeanAll) {
  const std::string json = scratch_dir("recompute-beyond") + "/bench.json";
  RunOutput run = run_dstrain(0, {"bench", "step", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny-v3.ini",
                                  "--train.device", "cpu", "--train.recompute", "full", "--train.recompute_layers",
                                  "9", "--bench.warmup", "1", "--bench.steps", "1", "--bench.json", json});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("train.recompute_layers = 9: no model chunk has more than 4 decoder layers (multi-token "
                            "prediction modules' included), so every layer is recomputed, as with 0"),
            std::string::npos)
      << run.output;
}

// `dstrain model info` estimates a step's activation memory per mode within 15% of what `bench
// step` measures, for the dense and the V3-shaped tiny models (bench/RESULTS.md: the same for
// ~100M models at seq 512).
TEST(Recompute, ModelInfoEstimatesTheMeasuredActivationMemory) {
  for (const char* config : {"tiny.ini", "tiny-v3.ini"}) {
    for (const char* mode : {"none", "selective", "full"}) {
      const std::vector<std::string> common = {"--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/" + config,
                                               "--train.micro_batch", "1", "--train.grad_accum", "1",
                                               "--train.recompute", mode};
      std::vector<std::string> info = {"model", "info", "--json"};
      info.insert(info.end(), common.begin(), common.end());
      RunOutput estimate = run_dstrain(0, info);
      ASSERT_EQ(estimate.exit_code, 0) << estimate.output;
      const std::string json = scratch_dir(std::string("recompute-estimate-") + config + mode) + "/bench.json";
      std::vector<std::string> bench = {"bench", "step", "--train.device", "cpu", "--bench.warmup", "1",
                                        "--bench.steps", "1", "--bench.json", json};
      bench.insert(bench.end(), common.begin(), common.end());
      RunOutput measured = run_dstrain(0, bench);
      ASSERT_EQ(measured.exit_code, 0) << measured.output;
      const double estimated = nlohmann::json::parse(estimate.output)["memory_per_rank"]["activations"].get<double>();
      const double peak = read_json(json)["peak_activation_bytes"].get<double>();
      EXPECT_NEAR(estimated / peak, 1.0, 0.15) << config << ", recompute " << mode << ": estimated " << estimated
                                               << " bytes, measured " << peak;
    }
  }
}
