// 8-bit gradient communication (comm.grad_dtype = int8 or fp8) on real mpirun ranks: training
// ends within 1% of the fp32 run's loss with error feedback, sends less than half the fp32 bytes
// (a quarter in its all-to-all, plus the bf16 all-gather), resumes bitwise with each rank's
// carried quantization error, and works with ZeRO-1, pipeline and expert parallelism.
#include <gtest/gtest.h>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

double final_loss(const std::string& run_dir) { return read_json(run_dir + "/summary.json")["final_loss"].get<double>(); }

double bytes_per_step(const std::string& run_dir) {
  const auto records = read_jsonl(run_dir + "/metrics.jsonl");
  for (const auto& r : records)
    if (r.contains("dp_comm_bytes")) return r["dp_comm_bytes"].get<double>();
  ADD_FAILURE() << run_dir << ": no dp_comm_bytes in metrics.jsonl";
  return 0;
}

}  // namespace

TEST(QuantizedGradients, TrainWithin1PercentOfFp32AndSendLess) {
  const std::vector<std::string> common = {"--train.steps", "200", "--log.interval", "50"};
  const std::string fp32 = scratch_dir("quantized-fp32");
  std::vector<std::string> args = common;
  RunOutput reference = train_tiny(2, fp32, args);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  for (const char* dtype : {"int8", "fp8"}) {
    const std::string dir = scratch_dir(std::string("quantized-") + dtype);
    args = common;
    args.insert(args.end(), {"--comm.grad_dtype", dtype, "--comm.error_feedback", "true"});
    RunOutput run = train_tiny(2, dir, args);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NEAR(final_loss(dir) / final_loss(fp32), 1.0, 0.01) << dtype;
    EXPECT_LT(bytes_per_step(dir), 0.4 * bytes_per_step(fp32)) << dtype;
    EXPECT_NE(run.output.find("MB sent"), std::string::npos) << run.output;
  }
}

// Stopped after the checkpoint of step 6 (the same schedule: decay_steps given) and started again,
// the int8 run with error feedback ends bitwise where the run that never stopped ended: each
// rank's carried error is in the checkpoint.
TEST(QuantizedGradients, ResumesBitwiseWithTheCarriedError) {
  const std::vector<std::string> common = {"--train.steps", "12", "--optim.decay_steps", "12", "--ckpt.interval", "6",
                                           "--comm.grad_dtype", "int8", "--comm.error_feedback", "true"};
  const std::string whole = scratch_dir("quantized-whole"), resumed = scratch_dir("quantized-resumed");
  RunOutput run = train_tiny(2, whole, common);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<std::string> stopped = common;
  stopped.insert(stopped.end(), {"--train.steps", "6"});
  ASSERT_EQ(train_tiny(2, resumed, stopped).exit_code, 0);
  dstrain::CheckpointReader checkpoint(resumed + "/checkpoints/step_00000006.h5");
  for (const char* rank : {"rank_00000", "rank_00001"}) {
    const std::string name = std::string("comm/error_feedback/replicated/") + rank;
    ASSERT_NE(checkpoint.find(name), nullptr) << name;
    EXPECT_GT(checkpoint.read(name).abs().sum().item<double>(), 0.0) << name;
  }
  run = train_tiny(2, resumed, common);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("resuming from"), std::string::npos) << run.output;
  EXPECT_EQ(read_json(resumed + "/summary.json")["param_digest"], read_json(whole + "/summary.json")["param_digest"]);
}

// Resumed on the same ranks with another parallel.ep, the carried errors belong to gradient
// buckets of another layout: they start again from zero, as for another dp, and the run says so;
// so do they for buckets of another size.
TEST(QuantizedGradients, ResumedWithOtherBucketsTheCarriedErrorStartsAgain) {
  const std::vector<std::string> common = {"--train.device", "cpu", "--optim.decay_steps", "4", "--ckpt.interval", "2",
                                           "--comm.grad_dtype", "int8", "--comm.error_feedback", "true"};
  const std::string dir = scratch_dir("quantized-other-ep");
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--parallel.ep", "2", "--train.steps", "2"});
  RunOutput run = train_tiny_v3(2, dir, first);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<std::string> second = common;
  second.insert(second.end(), {"--train.steps", "4"});
  run = train_tiny_v3(2, dir, second);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("written by dp 2 × pp 1 (experts over ep 2)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("was written on another layout; the error carried over starts from zero"),
            std::string::npos)
      << run.output;

  second.insert(second.end(), {"--train.steps", "6", "--comm.bucket_mb", "0.05"});
  run = train_tiny_v3(2, dir, second);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("has no carried quantization error for these gradient buckets"), std::string::npos)
      << run.output;
}

TEST(QuantizedGradients, WorkWithZeroPipelineAndExpertParallelism) {
  struct Case {
    const char* name;
    bool v3;
    std::vector<std::string> layout;
  };
  for (const Case& c : {Case{"zero-pp", false, {"--parallel.pp", "2", "--optim.zero", "1"}},
                        Case{"ep", true, {"--parallel.ep", "2", "--optim.zero", "1"}}}) {
    std::vector<std::string> args = c.layout;
    args.insert(args.end(), {"--train.steps", "30"});
    const std::string fp32 = scratch_dir(std::string("quantized-layout-fp32-") + c.name);
    RunOutput reference = c.v3 ? train_tiny_v3(4, fp32, args) : train_tiny(4, fp32, args);
    ASSERT_EQ(reference.exit_code, 0) << reference.output;
    args.insert(args.end(), {"--comm.grad_dtype", "int8", "--comm.error_feedback", "true"});
    const std::string dir = scratch_dir(std::string("quantized-layout-int8-") + c.name);
    RunOutput run = c.v3 ? train_tiny_v3(4, dir, args) : train_tiny(4, dir, args);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NEAR(final_loss(dir) / final_loss(fp32), 1.0, 0.02) << c.name;
  }
}

TEST(QuantizedGradients, ErrorFeedbackWithoutQuantizationIsRefused) {
  RunOutput run = train_tiny(0, scratch_dir("quantized-refused"), {"--comm.error_feedback", "true"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("comm.error_feedback"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("comm.grad_dtype = fp32"), std::string::npos) << run.output;
}

// A gradient that is not finite stays so through the quantization: the step stops the run as it
// does in fp32 (exit code 6), with the last good checkpoint.
TEST(QuantizedGradients, ANonFiniteGradientStopsTheRun) {
  RunOutput run = train_tiny(2, scratch_dir("quantized-nan"), {"--train.steps", "6", "--comm.grad_dtype", "int8",
                                                               "--debug.fail_at_step", "3", "--debug.fail_mode", "nan"});
  EXPECT_EQ(run.exit_code, 6) << run.output;
}
