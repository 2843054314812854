// A contiguous piece of the model: what one pipeline (virtual) stage holds.
#pragma once

#include <cstdint>

#include "dstrain/model/model_config.h"

namespace dstrain {

// Expert parallelism: which of each MoE layer's routed experts a model instance holds, the
// `index`-th of `count` equal, contiguous parts (count 1: all of them), as its expert exchange says
// (expert_exchange.h). Contiguous, so that DeepSeek's expert groups (model.n_group) lie whole on
// ranks, or whole ranks in a group.
struct ExpertShard {
  int64_t index = 0, count = 1;

  int64_t first(int64_t experts) const { return experts / count * index; }
  int64_t size(int64_t experts) const { return experts / count; }
};

struct LayerSlice {
  int64_t first = 0, last = 0;  // decoder layers [first, last)
  bool has_embedding = true;    // model.embed_tokens
  bool has_head = true;         // model.norm and lm_head

  static LayerSlice whole(const ModelConfig& config) { return {0, config.num_layers, true, true}; }
};

}  // namespace dstrain
