#include "dstrain/optim/block_quantization.h"

#include "dstrain/core/fp8_e4m3.h"
#include "dstrain/core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dstrain {
namespace {

float largest_code(BlockFormat format) { return format == BlockFormat::kInt8 ? 127.0f : kE4M3Max; }

// int8 on the CPU in one pass per block (the tensor operations below take eight): the same
// arithmetic, scale = max|x| / 127 and round half to even.
QuantizedBlocks quantize_int8_on_host(const torch::Tensor& values) {
  const int64_t n = values.numel(), blocks = n / kQuantizationBlock;
  QuantizedBlocks q{torch::empty({n}, torch::kUInt8), torch::empty({blocks}, torch::kFloat32)};
  const float* x = values.data_ptr<float>();
  auto* codes = reinterpret_cast<int8_t*>(q.codes.data_ptr<uint8_t>());
  float* scales = q.scales.data_ptr<float>();
  for (int64_t b = 0; b < blocks; ++b) {
    const float* block = x + b * kQuantizationBlock;
    float largest = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kQuantizationBlock; ++i) {
      finite = finite && std::isfinite(block[i]);
      largest = std::max(largest, std::fabs(block[i]));
    }
    const float scale = finite ? largest / 127.0f : std::numeric_limits<float>::quiet_NaN();
    scales[b] = scale;
    const float divisor = finite && scale != 0.0f ? scale : 1.0f;
    int8_t* out = codes + b * kQuantizationBlock;
    for (int64_t i = 0; i < kQuantizationBlock; ++i)
      out[i] = finite ? static_cast<int8_t>(std::clamp(std::nearbyint(block[i] / divisor), -127.0f, 127.0f)) : 0;
  }
  return q;
}

torch::Tensor dequantize_int8_on_host(const QuantizedBlocks& q) {
  const int64_t n = q.codes.numel();
  torch::Tensor values = torch::empty({n}, torch::kFloat32);
  const torch::Tensor codes_tensor = q.codes.contiguous(), scales_tensor = q.scales.contiguous();
  const auto* codes = reinterpret_cast<const int8_t*>(codes_tensor.data_ptr<uint8_t>());
  const float* scales = scales_tensor.data_ptr<float>();
  float* out = values.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * scales[i / kQuantizationBlock];
  return values;
}

}  // namespace

QuantizedBlocks quantize_blocks(const torch::Tensor& values, BlockFormat format) {
  if (values.dim() != 1 || values.scalar_type() != torch::kFloat32 || values.numel() % kQuantizationBlock != 0)
    throw Error(ExitCode::kInternal, "quantize_blocks: expected fp32 values in whole blocks");
  if (format == BlockFormat::kInt8 && values.device().is_cpu()) return quantize_int8_on_host(values.contiguous());
  return quantize_blocks_with_tensor_ops(values, format);
}

QuantizedBlocks quantize_blocks_with_tensor_ops(const torch::Tensor& values, BlockFormat format) {
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
  if (format == BlockFormat::kInt8 && blocks.codes.device().is_cpu()) return dequantize_int8_on_host(blocks);
  return dequantize_blocks_with_tensor_ops(blocks, format);
}

torch::Tensor dequantize_blocks_with_tensor_ops(const QuantizedBlocks& blocks, BlockFormat format) {
  torch::Tensor values = format == BlockFormat::kInt8 ? blocks.codes.view(torch::kInt8).to(torch::kFloat32)
                                                      : e4m3_decode(blocks.codes.to(torch::kCPU)).to(blocks.codes.device());
  return (values.view({-1, kQuantizationBlock}) * blocks.scales.view({-1, 1})).view({-1});
}

}  // namespace dstrain
