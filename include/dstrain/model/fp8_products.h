// The three products of an FP8 linear map (fp8_recipe.h), emulated: operands quantized to E4M3
// in their recipe's tiles, dequantized to float32 and multiplied in float32. This is the function
// FP8 kernels compute with fp32 accumulation (up to the order of their sums), and it runs on every
// device and LibTorch version; the kernels, where used, are tested against it.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/model/fp8_recipe.h"

namespace dstrain {

// y = x Wᵀ: x [tokens, in], w [out, in], both quantized. float32 [tokens, out].
torch::Tensor fp8_output(const Fp8Tensor& x, const Fp8Tensor& w);
// dx = dy W: dy [tokens, out] quantized here in `output_grad_tile`, w quantized. float32 [tokens, in].
torch::Tensor fp8_input_gradient(const torch::Tensor& dy, const Fp8Tensor& w, Fp8Tile output_grad_tile);
// dW = dyᵀ x: dy [tokens, out] quantized here, x the input as kept by the forward product,
// quantized again where the tiling asks for other tiles. float32 [out, in].
torch::Tensor fp8_weight_gradient(const torch::Tensor& dy, const Fp8Tensor& kept_input, const Fp8Tiling& tiling);

}  // namespace dstrain
