// Work that follows every optimizer step on state the optimizer does not update by gradients
// (torchtitan's optimizer hooks): the MoE balancing bias, say. The training loop runs every hook
// after the step, and reports the values a hook offers.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

namespace dstrain {

class PostStepHook {
 public:
  virtual ~PostStepHook() = default;
  // `skipped`: a 0-dim fp32 tensor on the device, 1 when the optimizer skipped the step
  // (non-finite gradients), which must then change nothing. Nothing waits for the device.
  virtual void after_step(const torch::Tensor& skipped) = 0;
  // The last step's values to report, by name: 0-dim tensors on the device, this stage's share
  // (the report sums them over the pipeline stages). The same names on every rank, every step.
  virtual std::vector<std::pair<std::string, torch::Tensor>> step_values() const { return {}; }
};

}  // namespace dstrain
