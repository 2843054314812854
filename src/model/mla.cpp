#include "dstrain/model/mla.h"

#include <limits>

#include "dstrain/model/causal_attention.h"
#include "dstrain/model/context_parallel.h"
#include "dstrain/model/recompute.h"
#include "dstrain/model/tensor_parallel_projections.h"

namespace dstrain {
namespace {

// The norms of the compressed query and key/value take RMSNorm's default epsilon in DeepSeek's
// modelling code (Hugging Face's and DeepSeek-V3's own), not the configuration's rms_norm_eps.
constexpr double kLatentNormEps = 1e-6;

}  // namespace

MultiHeadLatentAttentionImpl::MultiHeadLatentAttentionImpl(const ModelConfig& c, const ComputeOptions& options)
    : tp_{options.tensor_parallel, options.sequence_parallel},
      cp_(options.context_parallel),
      ring_passes_latent_(options.context_parallel_latent),
      heads_(split_by_tensor_parallel(c.num_heads, tp_.group, "model.num_heads")),
      nope_(c.qk_nope_head_dim),
      rope_dim_(c.qk_rope_head_dim),
      v_dim_(c.v_head_dim),
      kv_lora_rank_(c.kv_lora_rank),
      scale_(c.softmax_scale()),
      selective_(options.selective()) {
  const int64_t qk = nope_ + rope_dim_;
  const auto hidden = std::make_shared<Fp8InputShare>();  // the query's and the key-value latent's input
  if (c.q_lora_rank > 0) {
    q_a_proj_ = register_module("q_a_proj", layer_projection(c.hidden_size, c.q_lora_rank, options, hidden));
    q_a_layernorm_ = register_module("q_a_layernorm", RMSNorm(c.q_lora_rank, kLatentNormEps));
    q_b_proj_ = register_module("q_b_proj", layer_projection(c.q_lora_rank, heads_ * qk, options));
  } else {
    q_proj_ = register_module("q_proj", layer_projection(c.hidden_size, heads_ * qk, options, hidden));
  }
  kv_a_proj_with_mqa_ =
      register_module("kv_a_proj_with_mqa", layer_projection(c.hidden_size, kv_lora_rank_ + rope_dim_, options, hidden));
  kv_a_layernorm_ = register_module("kv_a_layernorm", RMSNorm(kv_lora_rank_, kLatentNormEps));
  kv_b_proj_ = register_module("kv_b_proj", layer_projection(kv_lora_rank_, heads_ * (nope_ + v_dim_), options));
  o_proj_ = register_module("o_proj", layer_projection(heads_ * v_dim_, c.hidden_size, options));
}

Tensors MultiHeadLatentAttentionImpl::down_project(const torch::Tensor& x) {
  if (tp_ && tp_.sequence_parallel) return project_into_tensor_parallel(tp_, x, {q_proj_ ? q_proj_ : q_a_proj_,
                                                                                 kv_a_proj_with_mqa_});
  return {q_proj_ ? q_proj_(to_heads(x)) : q_a_proj_(x), kv_a_proj_with_mqa_(x)};
}

torch::Tensor MultiHeadLatentAttentionImpl::to_heads(const torch::Tensor& x) {
  return tp_ && !tp_.sequence_parallel ? copy_to_tensor_parallel(x, *tp_.group) : x;
}

MultiHeadLatentAttentionImpl::Projected MultiHeadLatentAttentionImpl::up_project(const Tensors& down,
                                                                                 const RopeTables& rope) {
  const torch::Tensor& compressed = down[1];  // [B, S, latent + rope]
  const int64_t batch = compressed.size(0), seq = compressed.size(1);
  torch::Tensor q = q_proj_ ? down[0] : q_b_proj_(to_heads(q_a_layernorm_(down[0])));
  q = q.view({batch, seq, heads_, nope_ + rope_dim_}).transpose(1, 2);  // [B, H, S, qk]
  q = torch::cat({q.narrow(-1, 0, nope_), apply_rope(q.narrow(-1, nope_, rope_dim_), rope)}, -1);
  torch::Tensor latent = to_heads(kv_a_layernorm_(compressed.narrow(-1, 0, kv_lora_rank_)));
  torch::Tensor k_rope =
      apply_rope(to_heads(compressed.narrow(-1, kv_lora_rank_, rope_dim_)).unsqueeze(1), rope).squeeze(1);
  return {q, latent, k_rope};
}

std::pair<torch::Tensor, torch::Tensor> MultiHeadLatentAttentionImpl::keys_values(const torch::Tensor& latent,
                                                                                  const torch::Tensor& k_rope) {
  const int64_t batch = latent.size(0), seq = latent.size(1);
  torch::Tensor kv = kv_b_proj_(latent).view({batch, seq, heads_, nope_ + v_dim_}).transpose(1, 2);
  torch::Tensor rope_key = k_rope.unsqueeze(1).expand({batch, heads_, seq, rope_dim_});  // shared by the heads
  return {torch::cat({kv.narrow(-1, 0, nope_), rope_key}, -1), kv.narrow(-1, nope_, v_dim_).contiguous()};
}

Tensors MultiHeadLatentAttentionImpl::attention_inputs(const Tensors& down, const RopeTables& rope) {
  const Projected p = up_project(down, rope);
  auto [key, value] = keys_values(p.latent, p.k_rope);
  return {p.query, key, value};
}

torch::Tensor MultiHeadLatentAttentionImpl::ring_attention_of(const Tensors& down, const RopeTables& rope) {
  const Projected p = up_project(down, rope);
  RingAttentionInputs in;
  in.query = p.query;
  in.scale = scale_;
  const int64_t qk = nope_ + rope_dim_;
  if (ring_passes_latent_) {  // kv_lora_rank + rope values a token, expanded where they arrive
    in.passed = torch::cat({p.latent, p.k_rope}, -1);
    in.keys_values = [this](const torch::Tensor& t) {
      return keys_values(t.narrow(-1, 0, kv_lora_rank_), t.narrow(-1, kv_lora_rank_, rope_dim_));
    };
    in.expansion_parameters = kv_b_proj_->parameters();
  } else {  // heads × (qk + v) values a token
    auto [key, value] = keys_values(p.latent, p.k_rope);
    in.passed = torch::cat({key, value}, -1);
    in.keys_values = [qk, this](const torch::Tensor& t) {
      return std::make_pair(t.narrow(-1, 0, qk), t.narrow(-1, qk, v_dim_));
    };
  }
  return ring_attention(in, *cp_);
}

torch::Tensor MultiHeadLatentAttentionImpl::forward(const torch::Tensor& input, const RopeTables& rope) {
  // With sequence parallelism the heads attend over the gathered sequence, which the
  // down-projections take in; without, the up-projections' inputs enter the heads (to_heads).
  const Tensors down = down_project(input);
  const int64_t batch = input.size(0), seq = down[1].size(1);
  auto up = [this, rope](const Tensors& latents) { return attention_inputs(latents, rope); };
  auto attend = [this](const Tensors& qkv) {
    return Tensors{causal_attention(qkv[0], qkv[1], qkv[2], scale_, selective_)};
  };
  auto output = [&](const Tensors& out) {  // out: [B, H, S, v]
    return Tensors{o_proj_(out[0].transpose(1, 2).reshape({batch, seq, heads_ * v_dim_}))};
  };
  if (cp_) return tp_.leave(output({ring_attention_of(down, rope)})[0]);
  // Selective recomputation: the up-projections' outputs (queries, keys, values) are computed
  // again from the latents in the backward pass, not kept (nor, by causal_attention, the
  // probabilities of unfused attention).
  const torch::Tensor out =
      selective_.on ? output(recompute_outputs(up, down, attend, selective_.clock))[0] : output(attend(up(down)))[0];
  return tp_.leave(out);
}

torch::Tensor MultiHeadLatentAttentionImpl::forward_cached(const torch::Tensor& x, const RopeTables& rope,
                                                           AttentionCache& cache, int64_t start) {
  if (tp_) throw std::invalid_argument("cached decoding runs without tensor parallelism");
  const int64_t seq = x.size(1), keys = start + seq;
  const Projected p = up_project(down_project(x), rope);
  // The new positions join the cache; the queries see all of it.
  cache.latent.narrow(1, start, seq).copy_(p.latent);
  cache.rope_key.narrow(1, start, seq).copy_(p.k_rope);
  // Query i is position start + i: the keys after it are hidden.
  const torch::Tensor visible =
      torch::ones({seq, keys}, torch::dtype(torch::kBool).device(x.device())).tril(start).view({1, 1, seq, keys});
  return attend_latents(p.query, cache.latent.narrow(1, 0, keys), cache.rope_key.narrow(1, 0, keys), visible);
}

torch::Tensor MultiHeadLatentAttentionImpl::forward_decode(const torch::Tensor& x, const RopeTables& rope,
                                                           AttentionCache& cache, const DecodeStep& step) {
  if (tp_) throw std::invalid_argument("batched decoding runs without tensor parallelism");
  const int64_t batch = x.size(0);
  const Projected p = up_project(down_project(x), rope);
  cache.latent.index_put_({step.rows, step.positions}, p.latent.select(1, 0));
  cache.rope_key.index_put_({step.rows, step.positions}, p.k_rope.select(1, 0));
  return attend_latents(p.query, cache.latent.narrow(0, 0, batch).narrow(1, 0, step.keys),
                        cache.rope_key.narrow(0, 0, batch).narrow(1, 0, step.keys), step.visible);
}

torch::Tensor MultiHeadLatentAttentionImpl::attend_latents(const torch::Tensor& query, const torch::Tensor& latent,
                                                           const torch::Tensor& k_rope, const torch::Tensor& visible) {
  const int64_t batch = query.size(0), seq = query.size(2), keys = latent.size(1), c = kv_lora_rank_;
  // kv_b_proj's weight per head: [W_UK (nope rows) | W_UV (v rows)] × kv_lora_rank columns.
  const torch::Tensor w = kv_b_proj_->weight.view({heads_, nope_ + v_dim_, c});
  // Every head's query in latent space, [B, H, S, c]: W_UKᵀ q_nope.
  torch::Tensor q_latent = torch::matmul(query.narrow(-1, 0, nope_), w.narrow(1, 0, nope_));
  // The keys are shared by the heads: heads × queries become rows of one product with them.
  const int64_t rows = heads_ * seq;
  torch::Tensor scores = torch::matmul(q_latent.reshape({batch, rows, c}), latent.transpose(1, 2)) +
                         torch::matmul(query.narrow(-1, nope_, rope_dim_).reshape({batch, rows, rope_dim_}),
                                       k_rope.transpose(1, 2));  // [B, H × S, keys]
  scores = scores.view({batch, heads_, seq, keys}).to(torch::kFloat32) * scale_;
  scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1).to(latent.scalar_type());
  torch::Tensor attended = torch::matmul(probs.view({batch, rows, keys}), latent).view({batch, heads_, seq, c});
  // W_UV per head, [B, H, S, v].
  torch::Tensor out = torch::matmul(attended, w.narrow(1, nope_, v_dim_).transpose(1, 2));
  return o_proj_(out.transpose(1, 2).reshape({batch, seq, heads_ * v_dim_}));
}

AttentionCache MultiHeadLatentAttentionImpl::empty_cache(int64_t batch, int64_t capacity) const {
  const auto options = kv_a_proj_with_mqa_->weight.options();
  AttentionCache cache;
  cache.latent = torch::zeros({batch, capacity, kv_lora_rank_}, options);
  cache.rope_key = torch::zeros({batch, capacity, rope_dim_}, options);
  return cache;
}

}  // namespace dstrain
