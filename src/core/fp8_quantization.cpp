// Tiled FP8 quantization (fp8_quantization.h) with tensor operations over a zero-padded view of
// whole tiles, on the tensors' own device; the elements by compat::to_e4m3.
#include "dstrain/core/fp8_quantization.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "dstrain/core/torch_compat.h"

namespace dstrain {
namespace {

int64_t extent(int64_t asked, int64_t size) { return asked > 0 ? asked : std::max<int64_t>(size, 1); }
int64_t tiles(int64_t size, int64_t edge) { return (size + edge - 1) / edge; }

// `x` [rows, cols] zero-padded to whole tiles and viewed as [row tiles, tile rows, col tiles,
// tile cols].
torch::Tensor tiled(const torch::Tensor& x, int64_t tile_rows, int64_t tile_cols) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t row_tiles = tiles(rows, tile_rows), col_tiles = tiles(cols, tile_cols);
  // (LibTorch refuses to pad an empty tensor, even by nothing: no rows is no tiles.)
  const torch::Tensor padded =
      x.numel() == 0 ? x.new_zeros({row_tiles * tile_rows, col_tiles * tile_cols})
                     : torch::constant_pad_nd(x, {0, col_tiles * tile_cols - cols, 0, row_tiles * tile_rows - rows}, 0);
  return padded.reshape({row_tiles, tile_rows, col_tiles, tile_cols});
}

// The [rows, cols] tensor of a tiled view.
torch::Tensor untiled(const torch::Tensor& view, int64_t rows, int64_t cols) {
  return view.reshape({view.size(0) * view.size(1), view.size(2) * view.size(3)})
      .narrow(0, 0, rows)
      .narrow(1, 0, cols);
}

}  // namespace

Fp8Tensor fp8_quantize(const torch::Tensor& x, Fp8Tile tile) {
  if (x.dim() != 2) throw std::invalid_argument("fp8_quantize: a " + std::to_string(x.dim()) + "-D tensor; 2-D only");
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t tile_rows = extent(tile.rows, rows), tile_cols = extent(tile.cols, cols);
  const torch::Tensor view = tiled(x.to(torch::kFloat32), tile_rows, tile_cols);
  const torch::Tensor largest = view.abs().amax({1, 3});  // NaN where a tile holds one
  torch::Tensor scales = largest / kE4M3Max;
  // An all-zero tile gets 1; one so small that its scale underflows, the smallest positive float.
  scales = torch::where(largest == 0, torch::ones_like(scales), scales);
  scales = torch::where((scales == 0) & (largest > 0),
                        torch::full_like(scales, std::numeric_limits<float>::denorm_min()), scales);
  const torch::Tensor quotient = view / scales.unsqueeze(1).unsqueeze(3);
  return {compat::to_e4m3(untiled(quotient, rows, cols)), scales, tile};
}

torch::Tensor fp8_dequantize(const Fp8Tensor& q) {
  const int64_t rows = q.codes.size(0), cols = q.codes.size(1);
  const int64_t tile_rows = extent(q.tile.rows, rows), tile_cols = extent(q.tile.cols, cols);
  const torch::Tensor view = tiled(compat::from_e4m3(q.codes), tile_rows, tile_cols);
  return untiled(view * q.scales.unsqueeze(1).unsqueeze(3), rows, cols).contiguous();
}

}  // namespace dstrain
