// Activation memory measured, not guessed: the most a training step holds in tensors above what it
// started with (parameters, gradients and optimizer state are there before it begins), over every
// step measured. On a GPU this comes from the caching allocator's statistics; on the CPU, which
// keeps no such count, from the reports LibTorch's CPU allocator gives a memory profiler, which
// the meter receives on its own thread while a step runs.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <memory>

namespace dstrain::accel {

class StepMemoryMeter {
 public:
  explicit StepMemoryMeter(const torch::Device& device);
  ~StepMemoryMeter();

  // Around a step run on this thread.
  void begin_step();
  void end_step();
  // The largest step's bytes above its start so far; 0 before a step ends.
  int64_t peak_bytes() const { return peak_; }

  class CpuCounter;  // (the CPU's memory reports)

 private:
  torch::Device device_;
  int64_t start_ = 0, peak_ = 0;
  std::shared_ptr<CpuCounter> counter_;  // CPU only
  std::shared_ptr<void> reporting_;      // while a CPU step runs: the counter receives the reports
};

}  // namespace dstrain::accel
