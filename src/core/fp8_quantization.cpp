// Tiled FP8 quantization (fp8_quantization.h) with tensor operations over a zero-padded view of
// whole tiles, on the tensors' own device; the elements by compat::to_e4m3, or on GPUs by core's
// kernel (cuda/fp8_encode.h), which computes the same codes in one pass.
#include "dstrain/core/fp8_quantization.h"

#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "dstrain/core/torch_compat.h"

#if defined(DSTRAIN_WITH_CUDA_KERNELS) && DSTRAIN_TORCH_AT_LEAST(2, 1)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/fp8_encode.h"
#endif

namespace dstrain {
namespace {

int64_t extent(int64_t asked, int64_t size) { return asked > 0 ? asked : std::max<int64_t>(size, 1); }
int64_t tiles(int64_t size, int64_t edge) { return (size + edge - 1) / edge; }

// `x` [rows, cols] zero-padded to whole tiles and viewed as [row tiles, tile rows, col tiles,
// tile cols].
torch::Tensor tiled(const torch::Tensor& x, int64_t tile_rows, int64_t tile_cols) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t row_tiles = tiles(rows, tile_rows), col_tiles = tiles(cols, tile_cols);
  const int64_t padded_rows = row_tiles * tile_rows, padded_cols = col_tiles * tile_cols;
  torch::Tensor padded = x;  // whole tiles need no padding, which would copy
  // (LibTorch refuses to pad an empty tensor, even by nothing: no rows is no tiles.)
  if (x.numel() == 0)
    padded = x.new_zeros({padded_rows, padded_cols});
  else if (padded_rows != rows || padded_cols != cols)
    padded = torch::constant_pad_nd(x, {0, padded_cols - cols, 0, padded_rows - rows}, 0);
  return padded.reshape({row_tiles, tile_rows, col_tiles, tile_cols});
}

// The [rows, cols] tensor of a tiled view.
torch::Tensor untiled(const torch::Tensor& view, int64_t rows, int64_t cols) {
  return view.reshape({view.size(0) * view.size(1), view.size(2) * view.size(3)})
      .narrow(0, 0, rows)
      .narrow(1, 0, cols);
}

// The scale of each tile from its largest magnitude (NaN where the tile holds one): that / 448;
// an all-zero tile gets 1, one so small that its scale underflows the smallest positive float.
torch::Tensor scales_of(const torch::Tensor& largest) {
  torch::Tensor scales = largest / kE4M3Max;
  scales = torch::where(largest == 0, torch::ones_like(scales), scales);
  return torch::where((scales == 0) & (largest > 0),
                      torch::full_like(scales, std::numeric_limits<float>::denorm_min()), scales);
}

#if defined(DSTRAIN_WITH_CUDA_KERNELS) && DSTRAIN_TORCH_AT_LEAST(2, 1)
std::optional<cuda::Fp8Source> kernel_source(const torch::Tensor& x) {
  if (!x.is_cuda()) return std::nullopt;
  switch (x.scalar_type()) {
    case torch::kFloat32: return cuda::Fp8Source::kFloat32;
    case torch::kBFloat16: return cuda::Fp8Source::kBFloat16;
    case torch::kHalf: return cuda::Fp8Source::kFloat16;
    default: return std::nullopt;
  }
}

// On the GPU: the largest magnitudes by one reduction over the values in their own dtype (a
// maximum rounds nothing), the codes by core's kernel (cuda/fp8_encode.h) in one pass over them.
Fp8Tensor quantized_by_kernel(const torch::Tensor& x, cuda::Fp8Source source, Fp8Tile tile, int64_t tile_rows,
                              int64_t tile_cols) {
  const torch::Tensor largest =
      at::linalg_vector_norm(tiled(x, tile_rows, tile_cols), std::numeric_limits<double>::infinity(), {1, 3});
  const torch::Tensor scales = scales_of(largest.to(torch::kFloat32));
  const torch::Tensor values = x.contiguous(), scale_values = scales.contiguous();
  torch::Tensor codes = torch::empty(x.sizes(), x.options().dtype(torch::kUInt8));
  const c10::cuda::CUDAGuard guard(x.device());
  C10_CUDA_CHECK(cuda::fp8_encode(values.data_ptr(), source, x.size(0), x.size(1), scale_values.data_ptr<float>(),
                                  {tile_rows, tile_cols, scales.size(1)}, codes.data_ptr<uint8_t>(),
                                  at::cuda::getCurrentCUDAStream(x.device().index()).stream()));
  return {codes.view(torch::kFloat8_e4m3fn), scales, tile};
}
#endif

}  // namespace

Fp8Tensor fp8_quantize(const torch::Tensor& x, Fp8Tile tile) {
  if (x.dim() != 2) throw std::invalid_argument("fp8_quantize: a " + std::to_string(x.dim()) + "-D tensor; 2-D only");
  const int64_t tile_rows = extent(tile.rows, x.size(0)), tile_cols = extent(tile.cols, x.size(1));
#if defined(DSTRAIN_WITH_CUDA_KERNELS) && DSTRAIN_TORCH_AT_LEAST(2, 1)
  if (const std::optional<cuda::Fp8Source> source = kernel_source(x))
    return quantized_by_kernel(x, *source, tile, tile_rows, tile_cols);
#endif
  // Elsewhere LibTorch's operations over one fp32 view of whole tiles: the largest magnitudes and
  // the quotients both.
  const torch::Tensor view = tiled(x.to(torch::kFloat32), tile_rows, tile_cols);
  const torch::Tensor scales = scales_of(view.abs().amax({1, 3}));
  const torch::Tensor quotient = view / scales.unsqueeze(1).unsqueeze(3);
  return {compat::to_e4m3(untiled(quotient, x.size(0), x.size(1))), scales, tile};
}

int64_t fp8_quantized_bytes(int64_t rows, int64_t cols, Fp8Tile tile) {
  return rows * cols + 4 * tiles(rows, extent(tile.rows, rows)) * tiles(cols, extent(tile.cols, cols));
}

torch::Tensor fp8_dequantize(const Fp8Tensor& q) {
  const int64_t rows = q.codes.size(0), cols = q.codes.size(1);
  const int64_t tile_rows = extent(q.tile.rows, rows), tile_cols = extent(q.tile.cols, cols);
  const torch::Tensor view = tiled(compat::from_e4m3(q.codes), tile_rows, tile_cols);
  return untiled(view * q.scales.unsqueeze(1).unsqueeze(3), rows, cols).contiguous();
}

Fp8Tensor fp8_transposed(const Fp8Tensor& q) { return {q.codes.t(), q.scales.t(), {q.tile.cols, q.tile.rows}}; }

}  // namespace dstrain
