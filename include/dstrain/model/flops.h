// Parameter counts and training FLOPs of a model configuration, computed from its shape alone
// (no model is built): what MFU, `dstrain bench`, pipeline balancing and the start-up report use.
#pragma once

#include <cstdint>

#include "dstrain/model/model_config.h"

namespace dstrain {

struct ParameterCounts {
  int64_t total = 0;
  int64_t embedding = 0;  // the input embedding table (a lookup: no FLOPs)
  int64_t matmul = 0;     // weights of matrix products: every projection and the LM head
};

ParameterCounts count_parameters(const ModelConfig& config);

// FLOPs of one training token (forward and backward) at sequence length `seq_len`, counted as
// PaLM (Chowdhery et al. 2022, appendix B), torchtitan and llm.c count them:
//   6 × matmul parameters  +  12 × layers × heads × head_dim × seq_len
// The attention term counts the whole score matrix, although a causal kernel computes about half.
double training_flops_per_token(const ModelConfig& config, int64_t seq_len);

// The same count for one decoder layer, and for the LM head (the rest of the model).
double layer_training_flops_per_token(const ModelConfig& config, int64_t seq_len);
double head_training_flops_per_token(const ModelConfig& config);

}  // namespace dstrain
