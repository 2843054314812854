// E4M3, the 8-bit floating-point format of DeepSeek-V3's published weights (the "fn" variant of
// the OCP FP8 formats, PyTorch's float8_e4m3fn): 1 sign bit, 4 exponent bits with bias 7, 3
// mantissa bits. It has no infinities: S.1111.111 is NaN, so the largest finite value is
// 1.75 × 2^8 = 448; exponent bits 0 are subnormals, mantissa × 2^-9. LibTorch 1.13 has no 8-bit
// float type: codes travel as uint8 tensors and are converted here.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>

namespace dstrain {

constexpr float kE4M3Max = 448.0f;

// The value of one code: exact in float32 (NaN for 0x7F and 0xFF).
float e4m3_value(uint8_t code);
bool e4m3_is_nan(uint8_t code);

// The code nearest `value`, ties to the even code (IEEE's round to nearest even); magnitudes from
// 448 up, infinities included, saturate to ±448 (E4M3 has no infinity); NaN gives NaN. The sign
// is kept (-0 is 0x80).
uint8_t e4m3_code(float value);

// Elementwise over tensors: uint8 codes → float32 values of the same shape, and back.
torch::Tensor e4m3_decode(const torch::Tensor& codes);
torch::Tensor e4m3_encode(const torch::Tensor& values);

}  // namespace dstrain
