// LibTorch's grouped matrix product, aten::_grouped_mm (LibTorch 2.8 and later, CUDA, bf16): the
// matrix products of many groups in one kernel. A build against an older LibTorch (1.13, the CPU
// build's) has none, and its callers loop.
//
// Two forms, the groups given by their sizes:
//   a [M, K] × b [G, K, N] → [M, N]     group g: rows of a (and of the result) times b[g]
//   a [M, K] × b [K, N]    → [G, M, N]  group g: a slice of K, the columns of a and rows of b
// It applies to CUDA bf16 operands laid out as LibTorch requires (16-byte aligned, each matrix
// contiguous along rows or columns with a 16-byte multiple between them) and a result whose rows
// are a multiple of 8 long; the number of rows of `a`, and the groups' sizes, are free.
#pragma once

#include "dstrain/core/torch_api.h"

#include <atomic>
#include <vector>

namespace dstrain {

// Whether this build's LibTorch has the product.
bool grouped_matmul_built();
// Whether it applies to operands `a` and `b` (and the build has it).
bool grouped_matmul_applies(const torch::Tensor& a, const torch::Tensor& b);

// The product for the layers of a model chunk that use it (ComputeOptions::grouped_matmul). If
// LibTorch refuses a call, it says why once, as a warning, and returns an undefined tensor from
// then on, for every layer that shares it: the callers' loops compute the same products.
class GroupedMatmul {
 public:
  // The product, or an undefined tensor where it does not apply. `group_sizes` sum to M (3-D b)
  // or K (2-D b).
  torch::Tensor operator()(const torch::Tensor& a, const torch::Tensor& b, const std::vector<int64_t>& group_sizes);
  bool refused() const { return refused_.load(); }

 private:
  std::atomic<bool> refused_{false};
};

}  // namespace dstrain
