// The activation of the SwiGLU MLP: silu(gate) × up.
//
// On a GPU, with dstrain's CUDA kernels built and `cuda_kernel`, forward and backward are one fused kernel each and
// the backward pass keeps only gate and up (LibTorch's silu and product keep silu(gate) as well,
// and take 5 kernels for the two passes instead of 2); the arithmetic is fp32 with one rounding.
// Elsewhere it is LibTorch's silu and product.
#pragma once

#include "dstrain/core/torch_api.h"

namespace dstrain {

// gate and up of one shape and dtype; differentiable (first order) in both.
torch::Tensor swiglu_activation(const torch::Tensor& gate, const torch::Tensor& up, bool cuda_kernel = true);

}  // namespace dstrain
