// One FP8 copy of an input that several projections read (q, k and v of attention; MLA's query
// and key-value down-projections; gate and up of a SwiGLU, an expert's rows among them): the
// first projection to run quantizes it, the others find that copy, and the backward passes of all
// of them keep the one copy. The bf16 input itself is then kept by nobody and freed, which is where
// FP8's activation memory comes from.
//
// Nothing is held for long: the share remembers the input and its copy by weak references, so a
// copy lives only while a projection's backward pass keeps it, and an input freed and another made
// at its address is never taken for it. An input changed in place (its version moved) is
// quantized again.
#pragma once

#include "dstrain/core/torch_api.h"

#include <mutex>
#include <optional>
#include <vector>

#include "dstrain/core/fp8_quantization.h"

namespace dstrain {

class Fp8InputShare {
 public:
  // `rows` (all of `input`, or one expert's `part` of it) quantized in `tile`.
  Fp8Tensor quantized(const torch::Tensor& input, int64_t part, const torch::Tensor& rows, Fp8Tile tile);
  // Quantizations made so far (tests: one a shared input, not one a projection).
  int64_t made() const { return made_; }

 private:
  using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  struct Copy {
    int64_t part;
    Fp8Tile tile;
    WeakTensor codes, scales;
  };
  std::mutex mutex_;
  std::optional<WeakTensor> input_;
  uint32_t version_ = 0;
  std::vector<Copy> copies_;
  int64_t made_ = 0;
};

}  // namespace dstrain
