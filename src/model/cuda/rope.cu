// Rotary position embedding in one element-wise pass, forward and backward.
//
// As LibTorch operations a rotation is three kernels forward (the pair swap, x × cos, and an
// addcmul) and several more backward, over q and k, with tables rounded to the activations'
// dtype. Here each output element is read from its two inputs and the fp32 tables in one pass;
// the gradient is the rotation by the opposite angle (the tables' sine negated), the same kernel.
#include "elements.cuh"
#include "kernels.h"

namespace dstrain::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;

// One thread an element, no index arithmetic beyond multiplications: threadIdx.x is the
// dimension, blockIdx.z the batch, blockIdx.y the head, blockIdx.x × blockDim.y + threadIdx.y the
// position.
template <typename T>
__global__ void rope_kernel(const T* x, T* out, RopeLayout layout, const float* cos, const float* sin,
                            int64_t table_stride, bool interleave, float sin_sign) {
  const int64_t position = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (position >= layout.seq) return;
  const int64_t head = blockIdx.y, batch = blockIdx.z;
  const T* in = x + batch * layout.in_strides[0] + head * layout.in_strides[1] + position * layout.in_strides[2];
  T* result = out + batch * layout.out_strides[0] + head * layout.out_strides[1] + position * layout.out_strides[2];
  const int half = static_cast<int>(layout.head_dim / 2);
  const int i = threadIdx.x, partner = interleave ? (i ^ 1) : (i < half ? i + half : i - half);
  const int64_t at = position * table_stride + i;
  result[i] = from_float<T>(to_float(in[i]) * cos[at] + to_float(in[partner]) * (sin_sign * sin[at]));
}

template <typename T>
cudaError_t launch(const void* x, void* out, const RopeLayout& layout, const float* cos, const float* sin,
                   int64_t table_stride, bool interleave, bool inverse, cudaStream_t stream) {
  if (layout.batch * layout.heads * layout.seq == 0) return cudaSuccess;
  // A thread per dimension of a row, an even number of them; the grid's limits on heads and batch.
  if (layout.head_dim <= 0 || layout.head_dim % 2 != 0 || layout.head_dim > kThreadsPerBlock ||
      layout.heads > 65535 || layout.batch > 65535)
    return cudaErrorInvalidValue;
  const int rows_per_block = kThreadsPerBlock / static_cast<int>(layout.head_dim);
  const dim3 block(static_cast<unsigned>(layout.head_dim), static_cast<unsigned>(rows_per_block));
  const dim3 grid(static_cast<unsigned>((layout.seq + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(layout.heads), static_cast<unsigned>(layout.batch));
  rope_kernel<T><<<grid, block, 0, stream>>>(
      static_cast<const T*>(x), static_cast<T*>(out), layout, cos, sin, table_stride, interleave,
      inverse ? -1.f : 1.f);
  return cudaGetLastError();
}

}  // namespace

cudaError_t rope(const void* x, void* out, Element element, const RopeLayout& layout, const float* cos,
                 const float* sin, int64_t table_stride, bool interleave, bool inverse, cudaStream_t stream) {
  switch (element) {
    case Element::kFloat32:
      return launch<float>(x, out, layout, cos, sin, table_stride, interleave, inverse, stream);
    case Element::kBFloat16:
      return launch<__nv_bfloat16>(x, out, layout, cos, sin, table_stride, interleave, inverse, stream);
    case Element::kFloat16:
      return launch<__half>(x, out, layout, cos, sin, table_stride, interleave, inverse, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dstrain::cuda
