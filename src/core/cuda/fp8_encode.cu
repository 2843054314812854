// FP8 quantization's element pass (fp8_encode.h) as one kernel. In LibTorch operations it is
// four passes over fp32 copies (the upcast, the division, the clamp, the conversion), 27 bytes of
// traffic an element from bf16 values; here 3 (2 read, 1 written), the scales read from cache.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fp8_encode.h"

namespace dstrain::cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }

// The division rounds as IEEE's does (__fdiv_rn, whatever the compiler's flags), as LibTorch's
// quotient does; __NV_SATFINITE saturates to ±448 as the clamp before LibTorch's conversion does.
template <typename T>
__global__ void encode_kernel(const T* values, int64_t count, int64_t cols, const float* scales, Fp8EncodeTiles tiles,
                              uint8_t* codes) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = i / cols, col = i % cols;
    const float scale = scales[(row / tiles.tile_rows) * tiles.scale_cols + col / tiles.tile_cols];
    codes[i] = __nv_cvt_float_to_fp8(__fdiv_rn(to_float(values[i]), scale), __NV_SATFINITE, __NV_E4M3);
  }
}

template <typename T>
cudaError_t launch(const void* values, int64_t count, int64_t cols, const float* scales, const Fp8EncodeTiles& tiles,
                   uint8_t* codes, cudaStream_t stream) {
  const int64_t wanted = (count + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
  encode_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(values), count, cols, scales, tiles, codes);
  return cudaGetLastError();
}

}  // namespace

cudaError_t fp8_encode(const void* values, Fp8Source source, int64_t rows, int64_t cols, const float* scales,
                       const Fp8EncodeTiles& tiles, uint8_t* codes, cudaStream_t stream) {
  const int64_t count = rows * cols;
  if (count == 0) return cudaSuccess;
  switch (source) {
    case Fp8Source::kFloat32: return launch<float>(values, count, cols, scales, tiles, codes, stream);
    case Fp8Source::kBFloat16: return launch<__nv_bfloat16>(values, count, cols, scales, tiles, codes, stream);
    case Fp8Source::kFloat16: return launch<__half>(values, count, cols, scales, tiles, codes, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dstrain::cuda
