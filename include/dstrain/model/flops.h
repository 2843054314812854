// Parameter counts and training FLOPs of a model configuration, computed from its shape alone
// (no model is built): what MFU, `dstrain model info`, `dstrain bench`, pipeline balancing and
// the start-up report use.
#pragma once

#include <cstdint>

#include "dstrain/model/model_config.h"

namespace dstrain {

struct ParameterCounts {
  int64_t total = 0;      // every parameter of the main model (multi-token prediction apart)
  int64_t embedding = 0;  // the input embedding table (a lookup: no FLOPs)
  // Parameters a token passes through, as DeepSeek counts "activated" ones: all but the input
  // embedding and the routed experts it is not sent to.
  int64_t active = 0;
  int64_t matmul = 0;     // the active weights of matrix products: projections, router, LM head
  int64_t mtp = 0;        // the multi-token prediction modules (embedding and head shared, not counted)
};

ParameterCounts count_parameters(const ModelConfig& config);
// Every parameter of decoder layer `layer` (its norms included).
int64_t layer_parameters(const ModelConfig& config, int64_t layer);
// The part of them in routed experts (0 in a dense layer): what expert parallelism splits.
// `layer` ≥ num_layers is a multi-token prediction module's layer.
int64_t layer_routed_expert_parameters(const ModelConfig& config, int64_t layer);

// FLOPs of one training token (forward and backward) at sequence length `seq_len`, counted as
// PaLM (Chowdhery et al. 2022, appendix B), torchtitan and llm.c count them:
//   6 × active matmul parameters  +  6 × layers × heads × (qk_head_dim + v_head_dim) × seq_len
// (for MHA, 12 × layers × heads × head_dim × seq_len). The attention term counts the whole score
// matrix, although a causal kernel computes about half. The multi-token prediction modules, when
// configured, are included (mtp_training_flops_per_token): they are computed in every training step.
double training_flops_per_token(const ModelConfig& config, int64_t seq_len);
// The multi-token prediction modules' part of it (0 without them): each a decoder layer, its
// projection eh_proj and the shared LM head, counted per token of the sequence.
double mtp_training_flops_per_token(const ModelConfig& config, int64_t seq_len);

// The same count for decoder layer `layer`, the mean over the layers, and the LM head.
double layer_training_flops_per_token(const ModelConfig& config, int64_t seq_len, int64_t layer);
double layer_training_flops_per_token(const ModelConfig& config, int64_t seq_len);
double head_training_flops_per_token(const ModelConfig& config);

}  // namespace dstrain
