// The three products of an FP8 linear map (fp8_recipe.h): operands quantized to E4M3 in their
// recipe's tiles, multiplied with fp32 accumulation. On LibTorch's FP8 kernel where one is given
// and applies (fp8_matmul.h, GPUs: the result in bf16); elsewhere emulated, dequantized to float32
// and multiplied in float32 (the result in float32), which is the function the kernel computes up
// to the order of its sums, on every device and LibTorch version: the kernel's tests compare the two.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/model/fp8_recipe.h"

namespace dstrain {

class Fp8Matmul;  // fp8_matmul.h

// a · bᵀ, a [M, K] and b [N, K] both quantized in tiles along K: on `kernel` where it applies
// (nullptr: never), else emulated.
torch::Tensor fp8_product(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Matmul* kernel);

// y = x Wᵀ: x [tokens, in], w [out, in], both quantized. [tokens, out].
torch::Tensor fp8_output(const Fp8Tensor& x, const Fp8Tensor& w, Fp8Matmul* kernel);
// dx = dy W: dy [tokens, out] quantized here in `output_grad_tile`, w quantized. [tokens, in].
torch::Tensor fp8_input_gradient(const torch::Tensor& dy, const Fp8Tensor& w, Fp8Tile output_grad_tile,
                                 Fp8Matmul* kernel);
// dW = dyᵀ x: dy [tokens, out] quantized here, x the input as kept by the forward product,
// quantized again where the tiling asks for other tiles. [out, in].
torch::Tensor fp8_weight_gradient(const torch::Tensor& dy, const Fp8Tensor& kept_input, const Fp8Tiling& tiling,
                                  Fp8Matmul* kernel);

}  // namespace dstrain
