#include "dstrain/model/fp8_products.h"

namespace dstrain {

torch::Tensor fp8_output(const Fp8Tensor& x, const Fp8Tensor& w) {
  return fp8_dequantize(x).mm(fp8_dequantize(w).t());
}

torch::Tensor fp8_input_gradient(const torch::Tensor& dy, const Fp8Tensor& w, Fp8Tile output_grad_tile) {
  return fp8_dequantize(fp8_quantize(dy, output_grad_tile)).mm(fp8_dequantize(w));
}

torch::Tensor fp8_weight_gradient(const torch::Tensor& dy, const Fp8Tensor& kept_input, const Fp8Tiling& tiling) {
  // DeepSeek-V3 keeps the input in 1×128 tiles and turns them into 128×1 for this product, which
  // contracts over tokens: dequantized, then quantized again. Same tiles: the kept codes as they are.
  const Fp8Tensor x = kept_input.tile == tiling.input_for_weight
                          ? kept_input
                          : fp8_quantize(fp8_dequantize(kept_input), tiling.input_for_weight);
  return fp8_dequantize(fp8_quantize(dy, tiling.output_grad_for_weight)).t().mm(fp8_dequantize(x));
}

}  // namespace dstrain
