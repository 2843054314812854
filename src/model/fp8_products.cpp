#include "dstrain/model/fp8_products.h"

#include "dstrain/model/fp8_matmul.h"

namespace dstrain {

torch::Tensor fp8_product(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Matmul* kernel) {
  if (kernel) {
    torch::Tensor result = (*kernel)(a, b);
    if (result.defined()) return result;
  }
  return fp8_dequantize(a).mm(fp8_dequantize(b).t());
}

torch::Tensor fp8_output(const Fp8Tensor& x, const Fp8Tensor& w, Fp8Matmul* kernel) {
  return fp8_product(x, w, kernel);
}

torch::Tensor fp8_input_gradient(const torch::Tensor& dy, const Fp8Tensor& w, Fp8Tile output_grad_tile,
                                 Fp8Matmul* kernel) {
  // W's tiles for this product lie along its rows, the contracted output features: Wᵀ's along K.
  return fp8_product(fp8_quantize(dy, output_grad_tile), fp8_transposed(w), kernel);
}

torch::Tensor fp8_weight_gradient(const torch::Tensor& dy, const Fp8Tensor& kept_input, const Fp8Tiling& tiling,
                                  Fp8Matmul* kernel) {
  // DeepSeek-V3 keeps the input in 1×128 tiles and turns them into 128×1 for this product, which
  // contracts over tokens: dequantized, then quantized again. Same tiles: the kept codes as they are.
  const Fp8Tensor x = kept_input.tile == tiling.input_for_weight
                          ? kept_input
                          : fp8_quantize(fp8_dequantize(kept_input), tiling.input_for_weight);
  // Both operands' tiles lie along the tokens: dyᵀ's and xᵀ's along K.
  return fp8_product(fp8_transposed(fp8_quantize(dy, tiling.output_grad_for_weight)), fp8_transposed(x), kernel);
}

}  // namespace dstrain
