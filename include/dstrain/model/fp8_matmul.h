// LibTorch's FP8 matrix product, aten::_scaled_mm, for the products of FP8 training
// (fp8_products.h): E4M3 operands with their scales, accumulated in fp32 (no fast accumulation),
// the result in bf16. It computes what the emulation computes, up to the order of its sums, on
// GPUs with FP8 tensor cores (compute capability 8.9 and up; DeepSeek's blockwise tiles on 9.0).
//
// One form, a · bᵀ, both operands [rows, K] tiled along K (fp8_transposed turns a quantization
// across K into one along it):
//   tensorwise  a and b one tile each;
//   rowwise     a and b a tile per row;
//   blockwise   a in 1×128 tiles, b in 128×128 blocks or 1×128 tiles (the weight gradient's).
// The routed experts' products go to one grouped kernel, aten::_scaled_grouped_mm, which takes
// one scale a row only: each expert's operands in one tile (tensorwise, the scale repeated down
// its rows) or a tile a row (rowwise); Hopper only.
// A build against an older LibTorch (1.13, the CPU build's) has none, nor does the CPU: the
// emulation computes there.
#pragma once

#include "dstrain/core/torch_api.h"

#include <atomic>
#include <string>
#include <vector>

#include "dstrain/core/fp8_quantization.h"

namespace dstrain {

// Whether this build's LibTorch has the product.
bool fp8_matmul_built();
// Whether this build's LibTorch has the experts' grouped kernel for GPU `device` (Hopper).
bool fp8_grouped_kernel_on(int device);
// Why the product does not apply to a · bᵀ on this build and device: empty where it does.
std::string fp8_matmul_refusal(const Fp8Tensor& a, const Fp8Tensor& b);

// The product for the layers of a model chunk that use it (ComputeOptions::fp8_matmul). If
// LibTorch refuses a call, it says why once, as a warning, and returns an undefined tensor from
// then on, for every layer that shares it: the emulation computes the same products.
class Fp8Matmul {
 public:
  // a [M, K] · b [N, K]ᵀ → bf16 [M, N], or an undefined tensor where the product does not apply.
  torch::Tensor operator()(const Fp8Tensor& a, const Fp8Tensor& b);
  bool refused() const { return refused_.load(); }

  // Whether experts' products of `rows` go to the grouped kernel (this build and `rows`' GPU have
  // it and it has not refused): their operands are then quantized as it takes them.
  bool groups(const torch::Tensor& rows) const;
  // Each expert's a[e] · b[e]ᵀ, its rows in the experts' order → bf16 [Σ rows, N]; a[e] [rows of e,
  // K] (undefined codes: none), b[e] [N, K], every operand in one tile or a tile a row. Undefined
  // where the grouped kernel does not apply.
  torch::Tensor grouped(const std::vector<Fp8Tensor>& a, const std::vector<Fp8Tensor>& b);
  bool grouped_refused() const { return grouped_refused_.load(); }

 private:
  std::atomic<bool> refused_{false}, grouped_refused_{false};
};

}  // namespace dstrain
