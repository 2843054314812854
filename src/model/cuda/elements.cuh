// Device-side helpers the kernels share: conversions between the tensors' element types and fp32,
// in which all arithmetic is done, and 16-byte packs of elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dstrain::cuda {

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// 16 bytes of elements: the widest load or store a thread makes in one instruction.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T at[kSize];
};

}  // namespace dstrain::cuda
