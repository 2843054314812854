// A module's weights quantized for FP8 products (fp8_products.h), kept until the weight changes:
// weights change once per optimizer step, while a step runs the forward product once per
// micro-batch (and again under recomputation). A weight's version counter moves with every
// in-place update (the optimizer's, a checkpoint load's, ZeRO-1's gather), and its memory moves
// when it is replaced, so a kept quantization is current while both are. One cache serves one
// weight (or one stack of experts' weights): it finds a kept quantization by expert and tile alone,
// so two weights would take each other's place and each be quantized again at every use.
// The forward and backward passes may run on different threads: lookups are serialized.
#pragma once

#include "dstrain/core/torch_api.h"

#include <mutex>
#include <vector>

#include "dstrain/core/fp8_quantization.h"

namespace dstrain {

class Fp8WeightCache {
 public:
  // `weight` [out, in] quantized in `tile`.
  Fp8Tensor quantized(const torch::Tensor& weight, Fp8Tile tile) { return quantized(weight, -1, tile); }
  // Expert `expert`'s weight of a stack [experts, out, in] quantized in `tile`.
  Fp8Tensor quantized(const torch::Tensor& stack, int64_t expert, Fp8Tile tile);
  // Quantizations made so far (tests: once per step, not per micro-batch).
  int64_t made() const { return made_; }

 private:
  struct Entry {
    const void* memory;
    int64_t expert;
    Fp8Tile tile;
    uint32_t version;
    Fp8Tensor quantized;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
  int64_t made_ = 0;
};

}  // namespace dstrain
