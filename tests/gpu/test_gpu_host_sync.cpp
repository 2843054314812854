// A training step on a GPU queues its work without waiting for it: the host is then a step ahead
// of the GPU, and only the log interval makes it wait (issue: "no host synchronisation inside a
// step except what the log interval needs").
#include <gtest/gtest.h>

#include "dstrain/core/accelerator.h"
#include "e2e_util.h"

using namespace dstrain;
using namespace dstrain::e2e;

namespace {

class GpuHostSync : public ::testing::Test {
 protected:
  void SetUp() override {
    if (accel::device_count() == 0) GTEST_SKIP() << "no GPU on this machine";
  }
};

}  // namespace

// The check itself: a scalar read and a blocking copy to the host throw while it is alive, and
// work again once it is gone.
TEST_F(GpuHostSync, ForbiddingHostSyncMakesWaitingOperationsThrow) {
  torch::Tensor on_gpu = torch::ones({4}, torch::kCUDA);
  {
    accel::HostSyncForbidden no_waiting(true);
    torch::Tensor doubled = on_gpu * 2;  // queued, not waited for
    EXPECT_THROW(doubled.sum().item<float>(), c10::Error);
    EXPECT_THROW(doubled.to(torch::kCPU), c10::Error);
  }
  EXPECT_EQ(on_gpu.sum().item<float>(), 4.0f);
  accel::HostSyncForbidden inactive(false);
  EXPECT_EQ((on_gpu * 3).sum().item<float>(), 12.0f);
}

// Whole runs of the tiny dense model (clipped at 1.0) with every step under the check: bf16, and
// fp16 with dynamic loss scaling (whose skip-or-step decision stays on the GPU), each with the
// default NCCL backend.
TEST_F(GpuHostSync, TrainingStepsDoNotWaitForTheGpu) {
  for (const char* precision : {"bf16", "fp16"}) {
    std::string gpu = scratch_dir(std::string("gpu-no-host-sync-") + precision);
    RunOutput run = train_tiny(1, gpu, {"--train.device", "cuda", "--train.precision", precision,
                                        "--debug.forbid_host_sync", "true"});
    ASSERT_EQ(run.exit_code, 0) << precision << ":\n" << run.output;
    EXPECT_NE(run.output.find("comm nccl"), std::string::npos) << run.output;
    EXPECT_EQ(train_records(gpu).size(), 20u) << precision;
  }
}

// DeepSeek-V3's shape (MLA, MoE with the balancing bias and the sequence balance loss, multi-token
// prediction): the per-expert batch sizes are the one wait, by design, and nothing else waits.
TEST_F(GpuHostSync, MoETrainingStepsWaitOnlyForTheExpertsBatchSizes) {
  std::string gpu = scratch_dir("gpu-no-host-sync-moe");
  RunOutput run = train_tiny(1, gpu, {"--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny-v3.ini",
                                      "--train.device", "cuda", "--train.precision", "bf16",
                                      "--debug.forbid_host_sync", "true"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(train_records(gpu).size(), 20u);
}
