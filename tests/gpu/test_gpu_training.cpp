// dstrain train on a GPU, end to end, checked against the CPU run of the same configuration.
// Runs where `ctest -L gpu` is run on a GPU host; the build has these tests only with CUDA.
#include <gtest/gtest.h>

#include <cmath>

#include "dstrain/core/accelerator.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// Per-step losses of two runs agree within `tolerance` (absolute), and so do evaluations.
void expect_close_losses(const std::string& a, const std::string& b, double tolerance) {
  auto ra = train_records(a), rb = train_records(b);
  ASSERT_EQ(ra.size(), 20u);
  ASSERT_EQ(rb.size(), ra.size());
  for (size_t i = 0; i < ra.size(); ++i)
    EXPECT_NEAR(ra[i]["loss"].get<double>(), rb[i]["loss"].get<double>(), tolerance) << "step " << i + 1;
  auto ea = eval_records(a), eb = eval_records(b);
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i)
    EXPECT_NEAR(ea[i]["eval_loss"].get<double>(), eb[i]["eval_loss"].get<double>(), tolerance);
}

void expect_learns(const std::string& run_dir) {
  auto records = train_records(run_dir);
  ASSERT_FALSE(records.empty());
  for (const auto& r : records) EXPECT_TRUE(std::isfinite(r["loss"].get<double>()));
  EXPECT_LT(records.back()["loss"].get<double>(), records.front()["loss"].get<double>() - 0.5);
}

class GpuTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (dstrain::accel::device_count() == 0) GTEST_SKIP() << "no GPU on this machine";
  }
};

}  // namespace

// fp32 on the GPU, two data-parallel ranks sharing it through the MPI backend: the CPU's
// losses, up to the different order of floating-point sums in GPU kernels.
TEST_F(GpuTraining, Fp32DataParallelOnOneGpuMatchesTheCpu) {
  std::string gpu = scratch_dir("gpu-fp32-dp2");
  RunOutput run = train_tiny(2, gpu, {"--train.device", "cuda", "--comm.backend", "mpi", "--train.micro_batch", "1",
                                      "--train.global_batch", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::string cpu = scratch_dir("gpu-fp32-cpu-gb2");
  RunOutput reference = train_tiny(1, cpu, {"--train.device", "cpu", "--train.micro_batch", "1", "--train.global_batch", "2"});
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  expect_close_losses(gpu, cpu, 1e-3);
  EXPECT_NE(read_json(gpu + "/summary.json")["device"].get<std::string>(), "cpu");
}

// bf16 parameters and activations (fp32 master weights) on the GPU, DP = 2 × PP = 2 on one GPU
// through the MPI backend: within bf16's tolerance of the fp32 CPU run on one rank.
TEST_F(GpuTraining, Bf16DataAndPipelineParallelOnOneGpuIsWithinBf16ToleranceOfTheCpu) {
  std::string gpu = scratch_dir("gpu-bf16-dp2-pp2");
  RunOutput run = train_tiny(4, gpu, {"--train.device", "cuda", "--comm.backend", "mpi", "--train.precision", "bf16",
                                      "--parallel.pp", "2", "--train.micro_batch", "1", "--train.global_batch", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::string cpu = scratch_dir("gpu-bf16-cpu-reference");
  RunOutput reference = train_tiny(1, cpu, {"--train.device", "cpu", "--train.micro_batch", "1", "--train.global_batch", "4"});
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  expect_close_losses(gpu, cpu, 0.05);
  expect_learns(gpu);
  auto records = train_records(gpu);
  EXPECT_GT(records.back()["memory_gib"].get<double>(), 0.0);
  EXPECT_TRUE(records.back().contains("pipeline_idle"));
}

// One rank, default backend (NCCL when built with it), bf16 gradients on the wire: trains.
TEST_F(GpuTraining, Bf16WithNcclTrains) {
  std::string gpu = scratch_dir("gpu-bf16-nccl");
  RunOutput run = train_tiny(1, gpu, {"--train.device", "cuda", "--train.precision", "bf16", "--comm.grad_dtype", "bf16"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("comm nccl"), std::string::npos) << run.output;
  expect_learns(gpu);
}

// fp16 with dynamic loss scaling: trains, and records the scale and the skipped steps.
TEST_F(GpuTraining, Fp16WithLossScalingTrains) {
  std::string gpu = scratch_dir("gpu-fp16");
  RunOutput run = train_tiny(1, gpu, {"--train.device", "cuda", "--train.precision", "fp16", "--optim.loss_scale", "16777216"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expect_learns(gpu);
  auto records = train_records(gpu);
  // 2^24 overflows the fp16 gradients of the logits (up to scale / tokens per micro-batch =
  // 2^24 / 64 > 65504): the first steps are skipped and the scale backs off until they fit.
  EXPECT_GT(records.back()["skipped_steps"].get<int64_t>(), 0);
  EXPECT_LT(records.back()["loss_scale"].get<double>(), 16777216.0);
}

// ZeRO-1 with bf16 on the GPU, two data-parallel ranks sharing it through the MPI backend (the
// reduce-scatter and all-gather staged through host memory): within bf16's tolerance of the
// unsharded fp32 CPU run.
TEST_F(GpuTraining, Bf16ZeroOneOnOneGpuIsWithinBf16ToleranceOfTheCpu) {
  std::string gpu = scratch_dir("gpu-bf16-zero1");
  RunOutput run = train_tiny(2, gpu, {"--train.device", "cuda", "--comm.backend", "mpi", "--train.precision", "bf16",
                                      "--optim.zero", "1", "--comm.bucket_mb", "0.02", "--train.micro_batch", "1",
                                      "--train.global_batch", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("(ZeRO-1)"), std::string::npos) << run.output;
  std::string cpu = scratch_dir("gpu-zero1-cpu-reference");
  RunOutput reference = train_tiny(1, cpu, {"--train.device", "cpu", "--train.micro_batch", "1", "--train.global_batch", "2"});
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  expect_close_losses(gpu, cpu, 0.05);
  expect_learns(gpu);
}

// Expert parallelism on the GPU: the V3-shaped tiny model with its experts split over two ranks
// sharing the GPU (the MPI backend stages the token exchange through host memory) trains as the
// CPU does on one rank.
TEST_F(GpuTraining, ExpertParallelOnOneGpuMatchesTheCpu) {
  std::string gpu = scratch_dir("gpu-ep2"), cpu = scratch_dir("gpu-ep2-cpu-reference");
  RunOutput run = train_tiny_v3(2, gpu, {"--train.device", "cuda", "--comm.backend", "mpi", "--parallel.ep", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  RunOutput reference = train_tiny_v3(1, cpu, {"--train.device", "cpu"});
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  expect_close_losses(gpu, cpu, 1e-3);
  EXPECT_TRUE(train_records(gpu).back().contains("ep_ranks_per_token"));
}

// The zero-bubble schedules on the GPU: the backward pass split into input and weight gradients
// (the weight-gradient store's products run on the device, its backward pass on autograd's device
// thread) and DualPipeV's V over two stages sharing the GPU through the MPI backend: the CPU's
// losses, up to the GPU kernels' order of sums.
TEST_F(GpuTraining, ZeroBubbleSchedulesOnOneGpuMatchTheCpu) {
  std::string cpu = scratch_dir("gpu-zb-cpu-reference");
  RunOutput reference = train_tiny_v3(1, cpu, {"--train.device", "cpu", "--model.num_layers", "4"});
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  for (const std::string schedule : {"zb-h1", "dualpipev"}) {
    std::string gpu = scratch_dir("gpu-" + schedule);
    RunOutput run = train_tiny_v3(2, gpu, {"--train.device", "cuda", "--comm.backend", "mpi", "--model.num_layers", "4",
                                           "--parallel.pp", "2", "--parallel.schedule", schedule,
                                           "--parallel.virtual_stages", schedule == "dualpipev" ? "2" : "1"});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    expect_close_losses(gpu, cpu, 1e-3);
  }
}
