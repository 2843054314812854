// Activation recomputation (train.recompute): a part of the forward pass that keeps only its input
// and reruns itself inside the backward pass, trading compute for activation memory (Megatron's
// full and selective recomputation; PyTorch's reentrant checkpoint). LibTorch's C++ API has no
// such utility: recompute_in_backward is the autograd function that does it.
//
// The rerun computes bitwise what the first pass computed (the same operations on the same
// values, on any device dstrain runs deterministically), so training gives the same numbers with
// or without it. Work that must happen once per forward pass (MoE's expert-load counts) asks
// recomputing() and skips the rerun.
#pragma once

#include "dstrain/core/torch_api.h"

#include <functional>
#include <string>

namespace dstrain {

// none: every activation kept; full: each decoder layer keeps only its input.
enum class Recompute { kNone, kFull };
// "none" | "full"; throws Error(kUsage) naming train.recompute otherwise.
Recompute recompute_named(const std::string& name);

struct RecomputePlan {
  Recompute mode = Recompute::kNone;
  int64_t layers = 0;  // full: the first `layers` decoder layers of each model chunk; 0: all
};

// `part(input)` without keeping its intermediate tensors: the backward pass reruns it on the kept
// `input` with gradients on and back-propagates through the rerun (into its parameters, whose
// gradients accumulate as usual, and into `input`). Without gradients (evaluation), or when
// `input` needs none (its parameters would get none through the rerun), just part(input).
torch::Tensor recompute_in_backward(const std::function<torch::Tensor(const torch::Tensor&)>& part,
                                    const torch::Tensor& input);

// True on this thread while a part reruns inside the backward pass.
bool recomputing();

}  // namespace dstrain
