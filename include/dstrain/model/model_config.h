// The shape of a DeepSeek decoder, read from the [model] section with Hugging Face's names:
// dense DeepSeek-LLM (multi-head or grouped-query attention, SwiGLU MLP), and DeepSeek-V2/V3
// (Multi-head Latent Attention when kv_lora_rank > 0; DeepSeekMoE when n_routed_experts > 0).
#pragma once

#include <cstdint>
#include <string>

#include "dstrain/core/config.h"

namespace dstrain {

// How the router scores experts: V2 by softmax, V3 by sigmoid.
enum class ScoringFunction { kSoftmax, kSigmoid };
// How it chooses them: the top k over all experts, or within the best groups ranked by their best
// score (V2's group_limited_greedy) or their two best plus the balancing bias (V3's noaux_tc).
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };
const EnumNames<ScoringFunction>& scoring_function_names();  // Hugging Face's names: softmax, sigmoid
const EnumNames<TopkMethod>& topk_method_names();            // greedy, group_limited_greedy, noaux_tc

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // of the dense MLP layers
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // MHA/GQA only
  double rope_theta = 10000.0;
  bool rope_interleave = false;  // false: half-split (rotate-half), as HF Llama-format checkpoints
  double rms_norm_eps = 1e-6;
  int64_t max_seq_len = 0;
  double init_std = 0.02;

  // Multi-head Latent Attention (DeepSeek-V2 §2.1): queries optionally through a low-rank
  // q_lora_rank bottleneck (0: a plain q_proj, as in V2-Lite), keys and values through a shared
  // kv_lora_rank latent; a decoupled RoPE key of qk_rope_head_dim shared by all heads.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;  // 0: MHA/GQA
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // YaRN rope scaling (rope.h): its factor (1: none), the frequency ramp between beta_fast and
  // beta_slow rotations over the original context, and the attention temperature, which
  // multiplies the softmax scale by mscale(factor, mscale_all_dim)^2.
  double rope_scaling_factor = 1.0;
  double rope_mscale_all_dim = 0.0;
  double rope_mscale = 1.0;
  int64_t rope_original_max_seq_len = 4096;  // the context the model was trained at
  double rope_beta_fast = 32, rope_beta_slow = 1;

  // DeepSeekMoE: layers from first_k_dense_replace on, every moe_layer_freq-th, replace the dense
  // MLP by n_shared_experts (as one MLP of width moe_intermediate_size × n_shared_experts) plus
  // n_routed_experts fine-grained experts of which num_experts_per_tok serve each token.
  int64_t n_routed_experts = 0;  // 0: dense
  int64_t n_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_experts_per_tok = 0;
  ScoringFunction scoring_func = ScoringFunction::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int64_t n_group = 1, topk_group = 1;   // experts in n_group groups; tokens choose among topk_group
  bool norm_topk_prob = false;           // renormalise the chosen experts' weights to sum to 1
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  double aux_loss_alpha = 0.0;           // the sequence-wise balance loss's weight (0: none)
  double bias_update_speed = 0.0;        // noaux_tc: gamma of the auxiliary-loss-free balance

  // Multi-token prediction (DeepSeek-V3 §2.2): D = num_nextn_predict_layers extra modules,
  // their losses weighted by mtp_loss_weight (lambda).
  int64_t num_nextn_predict_layers = 0;
  double mtp_loss_weight = 0.3;

  bool is_mla() const { return kv_lora_rank > 0; }
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // The per-head dimensions of queries/keys and of values.
  int64_t qk_head_dim() const { return is_mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim(); }
  int64_t value_head_dim() const { return is_mla() ? v_head_dim : head_dim(); }
  // The dimension RoPE rotates: the whole head (MHA/GQA) or the decoupled part (MLA).
  int64_t rope_dim() const { return is_mla() ? qk_rope_head_dim : head_dim(); }
  int64_t head_dim() const { return hidden_size / num_heads; }
  // The softmax scale: 1/sqrt(qk_head_dim), times YaRN's mscale² when rope scaling is on.
  double softmax_scale() const;
};

void add_model_options(OptionTable& table);
// Throws Error(kUsage) naming the key for values that cannot make a model (heads that do not
// divide the hidden size, an odd head dimension, ...).
ModelConfig read_model_config(const Options& options);

}  // namespace dstrain
