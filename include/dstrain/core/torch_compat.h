// Everything that differs between LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (GPU clusters)
// lives here, so that the rest of the code reads the same for both.
#pragma once

#include "dstrain/core/torch_api.h"

#ifndef TORCH_VERSION_MAJOR
#include <torch/version.h>
#endif

namespace dstrain::compat {

constexpr bool kHasFusedAttention = TORCH_VERSION_MAJOR >= 2;

// Causal attention on [batch, heads, seq, head_dim] tensors with the given softmax scale.
// LibTorch 2.x dispatches to flash / memory-efficient kernels; 1.13 computes it explicitly
// (softmax in fp32, so that low-precision inputs do not lose the normalisation).
inline torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, double scale) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true, scale);
#else
  const int64_t seq = q.size(-2);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)).mul(scale);
  torch::Tensor future = torch::ones({seq, seq}, torch::dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  torch::Tensor probs = torch::softmax(scores.to(torch::kFloat32), -1).to(q.scalar_type());
  return torch::matmul(probs, v);
#endif
}

}  // namespace dstrain::compat
