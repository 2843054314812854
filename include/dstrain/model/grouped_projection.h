// The matrix products of a MoE layer's routed experts, whose weights are stacked [experts, out,
// in]: the rows come sorted by expert (the first rows_per_expert[0] are expert 0's, the next
// rows_per_expert[1] expert 1's, ...) and each expert's rows are multiplied by its weight,
// y_e = x_e W_eᵀ.
//
// The products are those a Projection per expert computes (forward x Wᵀ; backward dx = dy W and
// dW = dyᵀ x, LibTorch's own linear backward), so stacking the weights changes no number. An
// expert without rows gets a zero weight gradient. Under a zero-bubble pipeline schedule (a
// `deferral` deferring() when the forward pass runs) the weight gradient is left to the schedule's
// W action, as Projection leaves its own.
//
// Given a `grouped` product, on GPUs in bf16 with LibTorch 2.8 or later, each of the three
// products is one grouped kernel (grouped_matmul.h); elsewhere they run one expert after another,
// the same products.
#pragma once

#include "dstrain/core/torch_api.h"

#include <vector>

#include "dstrain/model/grouped_matmul.h"
#include "dstrain/model/weight_gradient_deferral.h"

namespace dstrain {

// rows [N, in] with N = Σ rows_per_expert; weights [experts, out, in], one count per expert.
// Returns [N, out], differentiable with respect to rows and weights. `grouped` and `deferral` may
// be nullptr (ComputeOptions says which), and outlive the backward pass.
torch::Tensor grouped_projection(const torch::Tensor& rows, const torch::Tensor& weights,
                                 const std::vector<int64_t>& rows_per_expert, GroupedMatmul* grouped = nullptr,
                                 WeightGradientDeferral* deferral = nullptr);

}  // namespace dstrain
