// The shape of a dense DeepSeek-LLM-style decoder, read from the [model] section.
#pragma once

#include <cstdint>

#include "dstrain/core/config.h"

namespace dstrain {

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  double rope_theta = 10000.0;
  bool rope_interleave = false;  // false: half-split (rotate-half), as HF Llama-format checkpoints
  double rms_norm_eps = 1e-6;
  int64_t max_seq_len = 0;
  double init_std = 0.02;

  int64_t head_dim() const { return hidden_size / num_heads; }
};

void add_model_options(OptionTable& table);
// Throws Error(kUsage) naming the key for values that cannot make a model (heads that do not
// divide the hidden size, an odd head dimension, ...).
ModelConfig read_model_config(const Options& options);

}  // namespace dstrain
