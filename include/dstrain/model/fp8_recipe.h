// FP8 training (train.fp8): which scaling a decoder layer's linear maps use for their three
// products in E4M3, with fp32 accumulation.
//
//   forward          y  = x Wᵀ    contracted over the input features
//   input gradient   dx = dy W    contracted over the output features
//   weight gradient  dW = dyᵀ x   contracted over the tokens
//
// Every operand is scaled in tiles whose long side lies along its product's contracted
// dimension, so that each partial sum multiplies by one pair of scales:
//   tensorwise  one scale per tensor (torchao's default);
//   rowwise     one per row along the contracted dimension (torchao's "rowwise");
//   blockwise   DeepSeek-V3's recipe: activations and output gradients in 1×128 tiles (128×1 for
//               the weight gradient, which contracts over tokens), weights in 128×128 blocks.
// The input is kept for the backward pass in FP8 with its scales (DeepSeek's activation caching)
// and, where the weight gradient needs other tiles, dequantized and quantized again.
// Embedding, LM head and loss, router, norms, the attention core and the multi-token prediction
// projection stay in train.precision, as DeepSeek kept them.
#pragma once

#include "dstrain/core/config.h"
#include "dstrain/core/fp8_quantization.h"

namespace dstrain {

enum class Fp8Recipe { kNone, kTensorwise, kRowwise, kBlockwise };
// train.fp8's names: none, tensorwise, rowwise, blockwise.
const EnumNames<Fp8Recipe>& fp8_recipe_names();

// The tiles of each operand of the three products; x [tokens, in], W [out, in], dy [tokens, out].
struct Fp8Tiling {
  Fp8Tile input;                   // x in the forward product, and as kept for the backward pass
  Fp8Tile weight;                  // W in the forward product
  Fp8Tile output_grad;             // dy in the input gradient
  Fp8Tile weight_for_input_grad;   // W in the input gradient
  Fp8Tile output_grad_for_weight;  // dy in the weight gradient
  Fp8Tile input_for_weight;        // x in the weight gradient
};

// The tiling of `recipe` (not kNone).
Fp8Tiling fp8_tiling(Fp8Recipe recipe);

// The recipe the routed experts compute with: `recipe`, but where LibTorch's grouped kernel
// computes them (`grouped`), which takes a scale a row at most, rowwise for blockwise, the nearest
// it has (fp8_matmul.h).
Fp8Recipe experts_recipe(Fp8Recipe recipe, bool grouped);

}  // namespace dstrain
