// The host side of core's CUDA kernel for FP8 quantization (core/fp8_quantization.h): plain
// pointers and a stream, so that the .cu file needs no LibTorch header. Built only where a CUDA
// compiler was found (DSTRAIN_WITH_CUDA_KERNELS); elsewhere LibTorch operations compute the same.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dstrain::cuda {

enum class Fp8Source { kFloat32, kBFloat16, kFloat16 };

// The scales' tiling of the values: `tile_rows` × `tile_cols` elements a scale, `scale_cols` scales a row of them.
struct Fp8EncodeTiles {
  int64_t tile_rows, tile_cols, scale_cols;
};

// codes[i] = the E4M3 code of values[i] / its tile's scale, for `rows` × `cols` contiguous values
// and contiguous float32 scales: the quotient rounded to float32, then to the nearest E4M3 value,
// ties to even, magnitudes from 448 up saturating to 448, NaN kept. One pass over the values.
cudaError_t fp8_encode(const void* values, Fp8Source source, int64_t rows, int64_t cols, const float* scales,
                       const Fp8EncodeTiles& tiles, uint8_t* codes, cudaStream_t stream);

}  // namespace dstrain::cuda
