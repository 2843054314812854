// The projections that read a split layer's input (q, k and v; gate and up; MLA's
// down-projections under sequence parallelism), with the collective that brings the input into
// the tensor-parallel region folded in: one autograd function whose backward pass overlaps its
// collectives with the products (Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication).
//
//   forward     x → entered (all-gather of the sequence, or x itself) → yᵢ = entered Wᵢᵀ
//   backward    the all-gather of x again (sequence parallelism keeps x's shard, not the whole
//               sequence) runs while the input's gradient Σ dyᵢ Wᵢ is computed; the
//               reduce-scatter (or, without sequence parallelism, the all-reduce) of that gradient
//               runs while the weights' gradients dyᵢᵀ entered are computed, or handed to the
//               zero-bubble W action.
//
// Projections in FP8 compute their own products: the region's collective then runs by itself
// before them, not overlapped.
#pragma once

#include "dstrain/core/torch_api.h"

#include <vector>

#include "dstrain/model/projection.h"
#include "dstrain/model/tensor_parallel.h"

namespace dstrain {

// [projections[i](region.enter(x))...], as those compute it; without a region, of x itself.
std::vector<torch::Tensor> project_into_tensor_parallel(const TensorParallelRegion& region, const torch::Tensor& x,
                                                        const std::vector<Projection>& projections);

}  // namespace dstrain
