// Activation memory measured, not guessed: the most a training step holds in tensors above what it
// started with (parameters, gradients and optimizer state are there before it begins), over every
// step measured. On a GPU this comes from the caching allocator's statistics (the run's peak that
// peak_allocated_bytes reports survives the per-step resets); on the CPU, which keeps no such
// count, from an allocator that wraps LibTorch's CPU allocator and counts the bytes of every
// tensor allocated through it, on any thread, once a CPU meter exists.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>

namespace dstrain::accel {

class StepMemoryMeter {
 public:
  explicit StepMemoryMeter(const torch::Device& device);

  // Around a step.
  void begin_step();
  void end_step();
  // The largest step's bytes above its start so far; 0 before a step ends.
  int64_t peak_bytes() const { return peak_; }
  // A training step's activations: as peak_bytes, but above what the step kept past its end where
  // that is more. What it made to keep (the FP8 weight copies of the first step, LibTorch's buffers
  // made once) was there at its peak too, but is no activation.
  int64_t activation_bytes() const { return activations_; }
  // The most a step kept past its end above its start.
  int64_t kept_bytes() const { return kept_; }

 private:
  torch::Device device_;
  int64_t start_ = 0, peak_ = 0, activations_ = 0, kept_ = 0;
};

}  // namespace dstrain::accel
