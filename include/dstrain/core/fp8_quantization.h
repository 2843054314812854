// Fine-grained FP8 quantization, shared by FP8 linear maps (model/fp8_recipe.h) and the FP8 token
// dispatch of expert parallelism: a 2-D tensor as E4M3 elements (fp8_e4m3.h) with one float32
// scale per tile of `tile.rows × tile.cols` elements, the tiles at the bottom and right edges
// partial. Each tile's scale is its largest magnitude / 448, so that its largest element maps onto
// E4M3's largest value; an all-zero tile gets 1. An element is `code value × its tile's scale`.
//
// DeepSeek-V3 quantizes activations and gradients in 1×128 tiles and weights in 128×128 blocks;
// tensorwise scaling is one tile over the whole tensor, rowwise one tile per row (or column).
// The quotient element / scale is rounded to float32 first (as GPU kernels compute it), then to
// the nearest E4M3 value, ties to even, magnitudes from 448 up saturating to 448. A NaN or
// infinity in a tile makes every element of the tile NaN once dequantized, so that it is not lost.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>

namespace dstrain {

// DeepSeek-V3's tile and block edge.
constexpr int64_t kFp8TileEdge = 128;

// A tile's extent along rows and columns; 0: the whole dimension.
struct Fp8Tile {
  int64_t rows = 0, cols = 0;
  bool operator==(const Fp8Tile& o) const { return rows == o.rows && cols == o.cols; }
  bool operator!=(const Fp8Tile& o) const { return !(*this == o); }
};

struct Fp8Tensor {
  torch::Tensor codes;   // E4M3 elements [rows, cols], a byte each (compat::to_e4m3)
  torch::Tensor scales;  // float32 [ceil(rows / tile rows), ceil(cols / tile cols)]
  Fp8Tile tile;          // as asked (0: whole dimension)
  int64_t bytes() const { return codes.numel() + 4 * scales.numel(); }
};

// `x` (2-D, any floating type) quantized in tiles of `tile`.
Fp8Tensor fp8_quantize(const torch::Tensor& x, Fp8Tile tile);
// The bytes() of a [rows, cols] tensor quantized in tiles of `tile`, without quantizing one.
int64_t fp8_quantized_bytes(int64_t rows, int64_t cols, Fp8Tile tile);
// The float32 values `q` stands for.
torch::Tensor fp8_dequantize(const Fp8Tensor& q);
// `q` transposed, codes and scales (views): a quantization in r×c tiles becomes one in c×r tiles.
Fp8Tensor fp8_transposed(const Fp8Tensor& q);

}  // namespace dstrain
