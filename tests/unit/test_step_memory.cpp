// The step memory meter on the CPU (core/step_memory.h), against the exact bytes of the tensors a
// step makes.
#include <gtest/gtest.h>

#include "dstrain/core/step_memory.h"

using namespace dstrain;

// What a step makes and keeps past its end (as the first FP8 step makes the weight copies) is
// counted apart from its activations, which the temporaries alone make.
TEST(StepMemoryMeter, ActivationsLeaveOutWhatAStepKeepsPastItsEnd) {
  accel::StepMemoryMeter meter(torch::kCPU);
  const int64_t kept_bytes = 256 << 10, temporary_bytes = 1 << 20;
  torch::Tensor kept;
  meter.begin_step();
  kept = torch::ones({kept_bytes / 4});
  {
    const torch::Tensor temporary = torch::ones({temporary_bytes / 4});
    EXPECT_EQ(temporary.sum().item<float>(), static_cast<float>(temporary_bytes / 4));
  }
  meter.end_step();
  EXPECT_GE(meter.peak_bytes(), kept_bytes + temporary_bytes);
  EXPECT_EQ(meter.kept_bytes(), kept_bytes);
  EXPECT_EQ(meter.activation_bytes(), meter.peak_bytes() - kept_bytes);
  EXPECT_LT(meter.activation_bytes(), temporary_bytes + 4096);  // (the sum's few bytes besides)

  // A later step that keeps nothing more: the largest of either stays.
  meter.begin_step();
  { const torch::Tensor temporary = torch::ones({temporary_bytes / 2}); }
  meter.end_step();
  EXPECT_EQ(meter.kept_bytes(), kept_bytes);
  EXPECT_GE(meter.activation_bytes(), 2 * temporary_bytes);
}
