// Block-scaled FP8 weights as DeepSeek-V3 stores them: a 2-D weight [rows, cols] as E4M3 codes
// (core/fp8_e4m3.h), and beside it `scale_inv`, float32 [ceil(rows / block.rows), ceil(cols /
// block.cols)], one scale per block of block.rows × block.cols elements (the blocks at the bottom
// and right edges partial). The weight is each code's value × its block's scale_inv, as DeepSeek's
// inference/kernel.py (weight_dequant) computes it.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain {

struct Fp8BlockSize {
  int64_t rows = 128, cols = 128;  // DeepSeek-V3's weight_block_size
};

// The shape of the scales of a weight of `weight_shape` (2-D).
std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& weight_shape, Fp8BlockSize block);

// "" when every scale is finite and positive, else what is wrong with the first one that is not
// ("element [0, 3] is nan"): a scale must turn codes into weights, not into NaN, infinities or zeros.
std::string fp8_scale_problem(const torch::Tensor& scale_inv);

// The float32 weight of uint8 E4M3 `codes` [rows, cols] and their float32 `scale_inv` (of
// fp8_scale_shape). Throws Error(kCheckpoint) naming `name` when the shapes disagree, a scale is
// not finite and positive, or a code is NaN.
torch::Tensor fp8_dequantize(const torch::Tensor& codes, const torch::Tensor& scale_inv, Fp8BlockSize block,
                             const std::string& name);

struct Fp8Weight {
  torch::Tensor codes;      // uint8 E4M3, the weight's shape
  torch::Tensor scale_inv;  // float32, fp8_scale_shape
};

// DeepSeek's quantization of a 2-D weight: each block's scale_inv is its largest magnitude / 448
// (1 for a block of zeros), and each element's code the nearest E4M3 value of element / scale_inv.
// Dequantized, each element is within 2^-4 of its block's largest magnitude of the weight. Throws
// Error(kCheckpoint) naming `name` when the weight has a NaN or infinity (no scale can hold it).
Fp8Weight fp8_quantize(const torch::Tensor& weight, Fp8BlockSize block, const std::string& name);

}  // namespace dstrain
