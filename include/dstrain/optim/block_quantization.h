// 8-bit gradients on the wire (comm.grad_dtype = int8 or fp8): values in blocks of
// kQuantizationBlock, each block scaled by its own fp32 factor so that its largest magnitude maps
// to the format's largest code, as DeepSpeed's ZeRO++ quantized gradients and DeepSeek-V3's FP8
// tiles do. int8: round(x / scale), scale = max|x| / 127, an error of at most scale / 2 per value.
// fp8: E4M3 (core/fp8_e4m3.h), scale = max|x| / 448, a relative error of at most 2^-4 for values
// in its normal range. A block of zeros is exact; a block holding an infinity or NaN comes back
// NaN throughout, so the step's gradient norm is not finite and the step stops as it would have.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <string>

namespace dstrain {

enum class BlockFormat { kInt8, kFp8E4M3 };
constexpr int64_t kQuantizationBlock = 256;

struct QuantizedBlocks {
  torch::Tensor codes;   // uint8 [n]: int8 two's complement, or E4M3 codes
  torch::Tensor scales;  // fp32 [n / kQuantizationBlock]
};

// `values`: fp32, 1-D, a multiple of kQuantizationBlock long. int8 on the CPU runs one loop per
// block; elsewhere, and for fp8, tensor operations (which GPUs run; exposed so that tests compare
// the two).
QuantizedBlocks quantize_blocks(const torch::Tensor& values, BlockFormat format);
torch::Tensor dequantize_blocks(const QuantizedBlocks& blocks, BlockFormat format);  // fp32 [n]
QuantizedBlocks quantize_blocks_with_tensor_ops(const torch::Tensor& values, BlockFormat format);
torch::Tensor dequantize_blocks_with_tensor_ops(const QuantizedBlocks& blocks, BlockFormat format);

}  // namespace dstrain
