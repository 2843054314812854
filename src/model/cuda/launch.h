// What the LibTorch side of dstrain's CUDA kernels shares: which kernel element type a tensor
// has, and the stream its work goes on.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>

#include "dstrain/core/torch_api.h"
#include "kernels.h"

namespace dstrain::cuda {

// The kernels' element type of `t`, if it is a CUDA tensor of a dtype they take.
inline std::optional<Element> element_of(const torch::Tensor& t) {
  if (!t.is_cuda()) return std::nullopt;
  switch (t.scalar_type()) {
    case torch::kFloat32: return Element::kFloat32;
    case torch::kBFloat16: return Element::kBFloat16;
    case torch::kFloat16: return Element::kFloat16;
    default: return std::nullopt;
  }
}

// The stream LibTorch's own kernels on t's device are queued on: ours go in the same order.
inline cudaStream_t stream_of(const torch::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace dstrain::cuda
