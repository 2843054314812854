// Multi-head Latent Attention (DeepSeek-V2 §2.1, V3 §2.1.1), with Hugging Face's names.
//
//   queries  q_proj(x), or with q_lora_rank: q_b_proj(q_a_layernorm(q_a_proj(x)))
//            per head: qk_nope_head_dim without position, qk_rope_head_dim rotated
//   keys, values: kv_a_proj_with_mqa(x) = [latent (kv_lora_rank) | k_rope (qk_rope_head_dim)]
//            kv_b_proj(kv_a_layernorm(latent)) = per head [k_nope | value (v_head_dim)]
//            k_rope is rotated once and shared by every head (the "decoupled" RoPE key)
//   softmax scale (qk_nope + qk_rope)^-0.5, times YaRN's mscale² when rope scaling is on
//   output   o_proj(attention), heads × v_head_dim → hidden
// In training the latent is expanded (as the reference implementation does). Cached decoding
// keeps the normalised latent and the rotated k_rope of each position (kv_lora_rank +
// qk_rope_head_dim numbers, not heads × (qk_head_dim + v_head_dim)) and never expands it:
// kv_b_proj is absorbed into the queries and the output (DeepSeek-V2 §2.1.2),
//   q_nope · (W_UK c) = (W_UKᵀ q_nope) · c      Σ p (W_UV c) = W_UV (Σ p c)
// so a new token costs heads × (kv_lora_rank + qk_rope_head_dim) per cached position instead
// of re-expanding every cached latent through kv_b_proj.
// Under tensor parallelism each rank holds num_heads / T heads (q_proj or q_b_proj and kv_b_proj
// column-parallel, o_proj row-parallel); the down-projections and their norms stay whole on every
// rank (DeepSeek-V3 in Megatron-LM and torchtitan); decoding runs without it.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/model/compute_options.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/projection.h"
#include "dstrain/model/recompute.h"
#include "dstrain/model/rope.h"

namespace dstrain {

class MultiHeadLatentAttentionImpl : public torch::nn::Module {
 public:
  explicit MultiHeadLatentAttentionImpl(const ModelConfig& config, const ComputeOptions& options = {});
  // x [B, S, hidden]; `rope`: tables of qk_rope_head_dim.
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope);
  // Cached decoding: x [B, n, hidden] holds positions start .. start + n - 1 and `rope` their
  // tables (rope_tables_from); their latents and RoPE keys join `cache`, and they attend to every
  // position cached so far.
  torch::Tensor forward_cached(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache, int64_t start);
  // Batched decoding: x [B, 1, hidden], row b at position step.positions[b] and `rope` its tables
  // (rope_tables_at); each row's latent and RoPE key join its row of `cache`, and it attends to
  // its own cached positions.
  torch::Tensor forward_decode(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache,
                               const DecodeStep& step);
  // Latents and RoPE keys for `capacity` positions (zeros), in the weights' dtype and device.
  AttentionCache empty_cache(int64_t batch, int64_t capacity) const;

 private:
  // What both computations start from: queries [B, heads, S, qk] (the RoPE part rotated), the
  // normalised latent [B, S, kv_lora_rank] and the rotated RoPE key [B, S, qk_rope_head_dim].
  struct Projected {
    torch::Tensor query, latent, k_rope;
  };
  // x → [the query's input to its up-projection (q_a_proj(x), or q_proj(x) itself), kv_a_proj(x)];
  // under sequence parallelism of the gathered sequence (tensor_parallel_projections.h).
  Tensors down_project(const torch::Tensor& x);
  // x entering this rank's heads: under tensor parallelism (without sequence parallelism, whose
  // gather before the down-projections sums them instead) where the gradients of the group's
  // heads are summed, so that what comes before (the down-projections and their norms, whole on
  // every rank) gets the whole gradient.
  torch::Tensor to_heads(const torch::Tensor& x);
  Projected up_project(const Tensors& down, const RopeTables& rope);
  // Training: the latent expanded, [query, key, value] as attention takes them.
  Tensors attention_inputs(const Tensors& down, const RopeTables& rope);
  // The keys [B, H, S, qk] and values [B, H, S, v] of latents [B, S, kv_lora] (normalised) and
  // rope keys [B, S, rope] (rotated), through kv_b_proj.
  std::pair<torch::Tensor, torch::Tensor> keys_values(const torch::Tensor& latent, const torch::Tensor& k_rope);
  // Context parallelism: the heads' outputs [B, H, S, v] by ring attention, the latents and rope
  // keys (or the keys and values) passing around the ring.
  torch::Tensor ring_attention_of(const Tensors& down, const RopeTables& rope);
  // Attention over cached latents and RoPE keys ([B, keys, ·]) with kv_b_proj absorbed, for
  // queries [B, H, S, qk]; `visible` [B or 1, 1, S, keys] (true: attended). Returns o_proj's output.
  torch::Tensor attend_latents(const torch::Tensor& query, const torch::Tensor& latent, const torch::Tensor& k_rope,
                               const torch::Tensor& visible);
  TensorParallelRegion tp_;  // heads split over its group (none: all here)
  ContextParallelGroup* cp_;  // the sequence's chunks over its ring (none: all here)
  bool ring_passes_latent_;   // ComputeOptions::context_parallel_latent
  int64_t heads_, nope_, rope_dim_, v_dim_, kv_lora_rank_;  // heads_: this rank's
  double scale_;
  SelectiveRecompute selective_;
  Projection q_proj_{nullptr}, q_a_proj_{nullptr}, q_b_proj_{nullptr};
  RMSNorm q_a_layernorm_{nullptr}, kv_a_layernorm_{nullptr};
  Projection kv_a_proj_with_mqa_{nullptr}, kv_b_proj_{nullptr}, o_proj_{nullptr};
};
TORCH_MODULE(MultiHeadLatentAttention);

}  // namespace dstrain
