// The matrix products of a MoE layer's routed experts, whose weights are stacked [experts, out,
// in]: the rows come sorted by expert (the first rows_per_expert[0] are expert 0's, the next
// rows_per_expert[1] expert 1's, ...) and each expert's rows are multiplied by its weight,
// y_e = x_e W_eᵀ.
//
// The products are those a Projection per expert computes (forward x Wᵀ; backward dx = dy W and
// dW = dyᵀ x, LibTorch's own linear backward), so stacking the weights changes no number. An
// expert without rows gets a zero weight gradient. Under a zero-bubble pipeline schedule
// (WeightGradientStore::deferring() when the forward pass runs) the weight gradient is left to
// the schedule's W action, as Projection leaves its own.
//
// The products run one expert after another, on every device. LibTorch 2.8 and later have a
// grouped product for CUDA in bf16 (at::_grouped_mm) that would make them one kernel a layer; it
// is not used yet (LibTorch 1.13, which the CPU build has, lacks it, and on the CPU it would gain
// nothing over the loop).
#pragma once

#include "dstrain/core/torch_api.h"

#include <vector>

namespace dstrain {

// rows [N, in] with N = Σ rows_per_expert; weights [experts, out, in], one count per expert.
// Returns [N, out], differentiable with respect to rows and weights.
torch::Tensor grouped_projection(const torch::Tensor& rows, const torch::Tensor& weights,
                                 const std::vector<int64_t>& rows_per_expert);

}  // namespace dstrain
