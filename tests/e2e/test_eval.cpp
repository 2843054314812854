// dstrain eval against the training loop's own evaluation of the same checkpoint and corpus,
// on the layout that trained it and on others.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <mutex>

#include "dstrain/core/files.h"
#include "dstrain/core/h5.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// Trains input/tiny.ini for 20 steps (checkpoint and final_model.h5 at the end; its eval_loss
// over 2 global batches of the validation corpus in summary.json) once per test process.
const std::string& trained_run() {
  static const std::string dir = [] {
    std::string d = scratch_dir("eval-trained-" + std::to_string(getpid()));
    RunOutput run = train_tiny(1, d, {"--train.device", "cpu", "--ckpt.interval", "20", "--ckpt.save_final", "true"});
    if (run.exit_code != 0) ADD_FAILURE() << run.output;
    return d;
  }();
  return dir;
}

nlohmann::json eval(int ranks, const std::string& ckpt, std::vector<std::string> extra, RunOutput* output = nullptr) {
  const std::string json = scratch_dir("eval-out-" + std::to_string(ranks) + "-" + std::to_string(getpid())) + "/eval.json";
  std::vector<std::string> args = {"eval", "--ckpt", ckpt, "--data", test_corpus().valid, "--json", json,
                                   "--train.device", "cpu"};
  args.insert(args.end(), extra.begin(), extra.end());
  RunOutput run = run_dstrain(ranks, args);
  if (output) *output = run;
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return run.exit_code == 0 ? read_json(json) : nlohmann::json();
}

}  // namespace

TEST(Eval, EqualsTheTrainingLoopsEvaluationOnTheSameLayout) {
  const double trained = read_json(trained_run() + "/summary.json")["final_eval_loss"];
  nlohmann::json result = eval(1, trained_run() + "/checkpoints", {"--batches", "2"});
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result["loss"].get<double>(), trained);  // the same computation, bitwise
  EXPECT_EQ(result["step"], 20);
  EXPECT_EQ(result["batches"], 2);
  EXPECT_EQ(result["tokens"], 2 * 2 * 32);  // 2 global batches × 2 sequences × 32 predicted tokens
  EXPECT_DOUBLE_EQ(result["perplexity"].get<double>(), std::exp(trained));
}

// ckpt.save_final's file is a checkpoint of the model alone: evaluated, it is the run's last
// evaluation; generate and export-hf read it as they read the run's checkpoints; a run cannot
// continue from it (no optimizer state).
TEST(Eval, TheFinalModelIsACheckpointOfTheModel) {
  const double trained = read_json(trained_run() + "/summary.json")["final_eval_loss"];
  const std::string final_model = trained_run() + "/final_model.h5";
  nlohmann::json result = eval(1, final_model, {"--batches", "2"});
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result["loss"].get<double>(), trained);
  EXPECT_EQ(result["step"], 20);

  auto generate = [](const std::string& ckpt) {
    return run_dstrain(0, {"generate", "--ckpt", ckpt, "--prompt", "the", "--max-new-tokens", "8", "--temperature",
                           "0", "--device", "cpu"});
  };
  RunOutput from_final = generate(final_model), from_checkpoint = generate(trained_run() + "/checkpoints");
  ASSERT_EQ(from_final.exit_code, 0) << from_final.output;
  EXPECT_EQ(from_final.output.substr(0, from_final.output.find('\n')),
            from_checkpoint.output.substr(0, from_checkpoint.output.find('\n')));
  const std::string hf = scratch_dir("eval-final-export-" + std::to_string(getpid())) + "/hf";
  RunOutput exported = run_dstrain(0, {"ckpt", "export-hf", final_model, "--output", hf});
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(dstrain::files::is_regular_file(hf + "/model.safetensors")) << exported.output;

  RunOutput resumed = train_tiny(1, scratch_dir("eval-final-resume-" + std::to_string(getpid())),
                                 {"--train.device", "cpu", "--ckpt.resume", final_model});
  EXPECT_EQ(resumed.exit_code, 4) << resumed.output;
  EXPECT_NE(resumed.output.find("without optimizer state"), std::string::npos) << resumed.output;
}

TEST(Eval, AnyLayoutGivesTheSameLoss) {
  const double trained = read_json(trained_run() + "/summary.json")["final_eval_loss"];
  const std::string ckpt = trained_run() + "/checkpoints";
  nlohmann::json pp2 = eval(2, ckpt, {"--batches", "2", "--parallel.pp", "2"});
  nlohmann::json dp2 = eval(2, ckpt, {"--batches", "2", "--parallel.dp", "2", "--train.micro_batch", "1"});
  nlohmann::json dp2pp2 = eval(4, ckpt, {"--batches", "2", "--parallel.pp", "2", "--train.micro_batch", "1"});
  for (const nlohmann::json* result : {&pp2, &dp2, &dp2pp2}) {
    ASSERT_TRUE(result->is_object());
    EXPECT_NEAR((*result)["loss"].get<double>(), trained, 1e-5);
  }
}

TEST(Eval, CheckpointOfAPipelineRunEvaluatesOnOneRank) {
  const std::string dir = scratch_dir("eval-trained-pp2");
  RunOutput run = train_tiny(2, dir, {"--train.device", "cpu", "--parallel.pp", "2", "--ckpt.interval", "20"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const double trained = read_json(dir + "/summary.json")["final_eval_loss"];
  nlohmann::json result = eval(1, dir + "/checkpoints", {"--batches", "2"});
  ASSERT_TRUE(result.is_object());
  EXPECT_NEAR(result["loss"].get<double>(), trained, 1e-5);
}

TEST(Eval, WholeCorpusByDefault) {
  nlohmann::json two = eval(1, trained_run() + "/checkpoints", {"--batches", "2"});
  nlohmann::json all = eval(1, trained_run() + "/checkpoints", {});
  ASSERT_TRUE(all.is_object());
  EXPECT_GT(all["batches"].get<int>(), 2);
  EXPECT_EQ(all["tokens"], all["batches"].get<int>() * 2 * 32);
  EXPECT_NE(all["loss"].get<double>(), two["loss"].get<double>());  // more data, another mean
}

TEST(Eval, BadInputIsOneClearError) {
  RunOutput missing_ckpt = run_dstrain(0, {"eval", "--ckpt", "/nonexistent/ckpt.h5", "--data", test_corpus().valid});
  EXPECT_EQ(missing_ckpt.exit_code, 4) << missing_ckpt.output;
  EXPECT_NE(missing_ckpt.output.find("/nonexistent/ckpt.h5"), std::string::npos) << missing_ckpt.output;
  RunOutput missing_data = run_dstrain(0, {"eval", "--ckpt", trained_run() + "/checkpoints", "--data", "/nonexistent.h5"});
  EXPECT_EQ(missing_data.exit_code, 2) << missing_data.output;
  EXPECT_NE(missing_data.output.find("--data = /nonexistent.h5"), std::string::npos) << missing_data.output;
  RunOutput bad_batches = run_dstrain(0, {"eval", "--ckpt", trained_run() + "/checkpoints", "--data",
                                          test_corpus().valid, "--batches", "-1"});
  EXPECT_EQ(bad_batches.exit_code, 2) << bad_batches.output;
  EXPECT_NE(bad_batches.output.find("--batches = -1"), std::string::npos) << bad_batches.output;
  RunOutput too_many = run_dstrain(2, {"eval", "--ckpt", trained_run() + "/checkpoints", "--data",
                                       test_corpus().valid, "--batches", "1000000", "--train.device", "cpu"});
  EXPECT_EQ(too_many.exit_code, 2) << too_many.output;
  EXPECT_EQ(too_many.output.find("[rank 1]"), std::string::npos) << "reported once: " << too_many.output;

  // Checkpoints without `latest`: the message names the newest.
  const std::string unlisted = scratch_dir("eval-unlisted");
  std::ofstream(unlisted + "/step_00000020.h5", std::ios::binary) << read_text(trained_run() + "/checkpoints/step_00000020.h5");
  RunOutput no_latest = run_dstrain(0, {"eval", "--ckpt", unlisted, "--data", test_corpus().valid});
  EXPECT_EQ(no_latest.exit_code, 4) << no_latest.output;
  EXPECT_NE(no_latest.output.find("holds checkpoints but no `latest` to choose one; give one of them, the newest being " +
                                  unlisted + "/step_00000020.h5"),
            std::string::npos) << no_latest.output;
  // An unwritable --json is found before the evaluation, not after it.
  std::ofstream(unlisted + "/a-file") << "x";
  RunOutput bad_json = run_dstrain(0, {"eval", "--ckpt", trained_run() + "/checkpoints", "--data", test_corpus().valid,
                                       "--json", unlisted + "/a-file/eval.json"});
  EXPECT_EQ(bad_json.exit_code, 2) << bad_json.output;
  EXPECT_NE(bad_json.output.find("--json = " + unlisted + "/a-file/eval.json: cannot create its directory"),
            std::string::npos) << bad_json.output;
  EXPECT_EQ(bad_json.output.find("eval of "), std::string::npos) << bad_json.output;
}

TEST(Eval, DamagedTensorOfOneStageEndsEveryRankWithOneMessage) {
  // lm_head.weight is read only by the last of two pipeline stages (rank 1): the other rank must
  // not wait for it, and the job ends with the checkpoint exit code, naming the tensor.
  const std::string damaged = scratch_dir("eval-damaged") + "/damaged.h5";
  {
    std::ifstream in(trained_run() + "/checkpoints/step_00000020.h5", std::ios::binary);
    std::ofstream out(damaged, std::ios::binary);
    out << in.rdbuf();
  }
  flip_a_byte(damaged, "/model/lm_head.weight");
  RunOutput run = run_dstrain(2, {"eval", "--ckpt", damaged, "--data", test_corpus().valid, "--train.device", "cpu",
                                  "--parallel.pp", "2", "--comm.timeout_s", "60"});
  EXPECT_EQ(run.exit_code, 4) << run.output;
  EXPECT_NE(run.output.find("lm_head.weight"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("did not finish"), std::string::npos) << "no timeout: " << run.output;
}
