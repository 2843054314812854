#include "dstrain/optim/block_quantization.h"

#include "dstrain/ckpt/fp8_e4m3.h"
#include "dstrain/core/error.h"

#include <limits>

namespace dstrain {
namespace {

float largest_code(BlockFormat format) { return format == BlockFormat::kInt8 ? 127.0f : kE4M3Max; }

}  // namespace

QuantizedBlocks quantize_blocks(const torch::Tensor& values, BlockFormat format) {
  if (values.dim() != 1 || values.scalar_type() != torch::kFloat32 || values.numel() % kQuantizationBlock != 0)
    throw Error(ExitCode::kInternal, "quantize_blocks: expected fp32 values in whole blocks");
  const torch::Tensor blocks = values.view({-1, kQuantizationBlock});
  // max|x| per block; a non-finite one makes the scale NaN, and so every value of the block.
  const torch::Tensor magnitude = blocks.abs().amax(1, /*keepdim=*/true);
  const torch::Tensor finite = torch::isfinite(blocks).all(1, /*keepdim=*/true);
  torch::Tensor scales = torch::where(finite, magnitude / largest_code(format),
                                      torch::full_like(magnitude, std::numeric_limits<float>::quiet_NaN()));
  // Zero blocks divide by 1 instead, and stay zero.
  const torch::Tensor divisor = torch::where(scales == 0, torch::ones_like(scales), scales);
  const torch::Tensor scaled = blocks / divisor;
  torch::Tensor codes;
  if (format == BlockFormat::kInt8) {
    codes = scaled.round().clamp(-127, 127).nan_to_num(0).to(torch::kInt8).view(torch::kUInt8);
  } else {
    const torch::Tensor on_host = scaled.to(torch::kCPU);
    codes = e4m3_encode(on_host.view({-1})).to(values.device());
  }
  return {codes.reshape({-1}), scales.view({-1})};
}

torch::Tensor dequantize_blocks(const QuantizedBlocks& blocks, BlockFormat format) {
  torch::Tensor values = format == BlockFormat::kInt8 ? blocks.codes.view(torch::kInt8).to(torch::kFloat32)
                                                      : e4m3_decode(blocks.codes.to(torch::kCPU)).to(blocks.codes.device());
  return (values.view({-1, kQuantizationBlock}) * blocks.scales.view({-1, 1})).view({-1});
}

}  // namespace dstrain
