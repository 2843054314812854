// A contiguous piece of the model: what one pipeline (virtual) stage holds.
#pragma once

#include <cstdint>

#include "dstrain/model/model_config.h"

namespace dstrain {

struct LayerSlice {
  int64_t first = 0, last = 0;  // decoder layers [first, last)
  bool has_embedding = true;    // model.embed_tokens
  bool has_head = true;         // model.norm and lm_head

  static LayerSlice whole(const ModelConfig& config) { return {0, config.num_layers, true, true}; }
};

}  // namespace dstrain
