#include "dstrain/model/mla.h"

#include "dstrain/core/torch_compat.h"

namespace dstrain {
namespace {

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

MultiHeadLatentAttentionImpl::MultiHeadLatentAttentionImpl(const ModelConfig& c)
    : heads_(c.num_heads),
      nope_(c.qk_nope_head_dim),
      rope_dim_(c.qk_rope_head_dim),
      v_dim_(c.v_head_dim),
      kv_lora_rank_(c.kv_lora_rank),
      scale_(c.softmax_scale()) {
  const int64_t qk = nope_ + rope_dim_;
  if (c.q_lora_rank > 0) {
    q_a_proj_ = register_module("q_a_proj", linear(c.hidden_size, c.q_lora_rank));
    q_a_layernorm_ = register_module("q_a_layernorm", RMSNorm(c.q_lora_rank, c.rms_norm_eps));
    q_b_proj_ = register_module("q_b_proj", linear(c.q_lora_rank, heads_ * qk));
  } else {
    q_proj_ = register_module("q_proj", linear(c.hidden_size, heads_ * qk));
  }
  kv_a_proj_with_mqa_ = register_module("kv_a_proj_with_mqa", linear(c.hidden_size, kv_lora_rank_ + rope_dim_));
  kv_a_layernorm_ = register_module("kv_a_layernorm", RMSNorm(kv_lora_rank_, c.rms_norm_eps));
  kv_b_proj_ = register_module("kv_b_proj", linear(kv_lora_rank_, heads_ * (nope_ + v_dim_)));
  o_proj_ = register_module("o_proj", linear(heads_ * v_dim_, c.hidden_size));
}

torch::Tensor MultiHeadLatentAttentionImpl::forward(const torch::Tensor& x, const RopeTables& rope) {
  return attend(x, rope, nullptr, 0);
}

torch::Tensor MultiHeadLatentAttentionImpl::forward_cached(const torch::Tensor& x, const RopeTables& rope,
                                                           AttentionCache& cache, int64_t start) {
  return attend(x, rope, &cache, start);
}

AttentionCache MultiHeadLatentAttentionImpl::empty_cache(int64_t batch, int64_t capacity) const {
  const auto options = kv_a_proj_with_mqa_->weight.options();
  AttentionCache cache;
  cache.latent = torch::zeros({batch, capacity, kv_lora_rank_}, options);
  cache.rope_key = torch::zeros({batch, capacity, rope_dim_}, options);
  return cache;
}

torch::Tensor MultiHeadLatentAttentionImpl::attend(const torch::Tensor& x, const RopeTables& rope,
                                                   AttentionCache* cache, int64_t start) {
  const int64_t batch = x.size(0), seq = x.size(1);
  torch::Tensor q = q_proj_ ? q_proj_(x) : q_b_proj_(q_a_layernorm_(q_a_proj_(x)));
  q = q.view({batch, seq, heads_, nope_ + rope_dim_}).transpose(1, 2);  // [B, H, S, qk]
  torch::Tensor compressed = kv_a_proj_with_mqa_(x);                      // [B, S, latent + rope]
  torch::Tensor latent = kv_a_layernorm_(compressed.narrow(-1, 0, kv_lora_rank_));
  torch::Tensor k_rope = apply_rope(compressed.narrow(-1, kv_lora_rank_, rope_dim_).unsqueeze(1), rope);  // [B, 1, S, rope]
  int64_t keys = seq;
  if (cache) {  // the new positions join the cache; the queries see all of it
    keys = start + seq;
    cache->latent.narrow(1, start, seq).copy_(latent);
    cache->rope_key.narrow(1, start, seq).copy_(k_rope.squeeze(1));
    latent = cache->latent.narrow(1, 0, keys);
    k_rope = cache->rope_key.narrow(1, 0, keys).unsqueeze(1);
  }
  torch::Tensor kv = kv_b_proj_(latent).view({batch, keys, heads_, nope_ + v_dim_}).transpose(1, 2);

  torch::Tensor q_rope = apply_rope(q.narrow(-1, nope_, rope_dim_), rope);
  torch::Tensor query = torch::cat({q.narrow(-1, 0, nope_), q_rope}, -1);
  torch::Tensor key = torch::cat({kv.narrow(-1, 0, nope_), k_rope.expand({batch, heads_, keys, rope_dim_})}, -1);
  torch::Tensor value = kv.narrow(-1, nope_, v_dim_).contiguous();
  torch::Tensor out = compat::causal_attention(query, key, value, scale_);  // [B, H, S, v]
  return o_proj_(out.transpose(1, 2).reshape({batch, seq, heads_ * v_dim_}));
}

}  // namespace dstrain
