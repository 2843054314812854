// The fp32 gradients ("main gradients", as Megatron calls them) of one rank's parameters, in one
// flat buffer: micro-batches accumulate into it, one collective reduces it over the DP group, and
// the norm, clipping and the optimizer read it.
//
// fp32 parameters accumulate straight into it: their .grad is a view of the buffer, and autograd
// adds into an existing .grad in place. bf16/fp16 parameters get a fresh .grad from each backward
// pass, which accumulate() adds in (the first of a step copies: no zeroing pass for them), so
// that summing micro-batches never rounds to 16 bits.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

namespace dstrain {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class GradientBuffer {
 public:
  // All parameters on one device; the buffer is allocated there.
  explicit GradientBuffer(const NamedTensors& params);

  void zero();        // before a step's first backward pass
  void accumulate();  // after each backward pass

  torch::Tensor& flat() { return flat_; }
  // One fp32 view of the buffer per parameter, in the order of `params`, with its shape.
  const std::vector<torch::Tensor>& grads() const { return views_; }

 private:
  NamedTensors params_;
  torch::Tensor flat_;
  std::vector<torch::Tensor> views_;
  std::vector<size_t> added_in_;  // indices of the bf16/fp16 parameters
  bool first_pass_ = true;        // no backward pass yet since zero()
};

}  // namespace dstrain
