#include "dstrain/model/layers.h"

#include <cmath>

#include "dstrain/core/profile_scope.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/model/causal_attention.h"
#include "dstrain/model/context_parallel.h"
#include "dstrain/model/recompute.h"
#include "dstrain/model/swiglu_activation.h"
#include "dstrain/model/tensor_parallel_projections.h"

namespace dstrain {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  ProfileScope scope(profile_part::kNorm);
  return compat::rms_norm(x, weight_, eps_);
}

TokenEmbeddingImpl::TokenEmbeddingImpl(int64_t vocab, int64_t hidden, TensorParallelRegion tp) : tp_(tp) {
  // N(0, 1), as torch::nn::Embedding starts; initialize_parameters sets the model's own.
  weight = register_parameter("weight",
                              torch::randn({split_by_tensor_parallel(vocab, tp.group, "model.vocab_size"), hidden}));
}

torch::Tensor TokenEmbeddingImpl::forward(const torch::Tensor& ids) {
  ProfileScope scope(profile_part::kEmbedding);
  if (!tp_) return torch::embedding(weight, ids);
  const int64_t rows = weight.size(0);
  const torch::Tensor local = ids - tp_.group->rank() * rows;
  const torch::Tensor elsewhere = (local < 0) | (local >= rows);
  const torch::Tensor found = torch::embedding(weight, local.masked_fill(elsewhere, 0));
  return tp_.leave(found.masked_fill(elsewhere.unsqueeze(-1), 0));
}

AttentionImpl::AttentionImpl(const ModelConfig& c, const ComputeOptions& options)
    : tp_{options.tensor_parallel, options.sequence_parallel},
      cp_(options.context_parallel),
      num_heads_(split_by_tensor_parallel(c.num_heads, tp_.group, "model.num_heads")),
      num_kv_heads_(split_by_tensor_parallel(c.num_kv_heads, tp_.group, "model.num_kv_heads")),
      head_dim_(c.head_dim()),
      selective_(options.selective()) {
  const auto hidden = std::make_shared<Fp8InputShare>();  // q, k and v read the same input
  q_proj_ = register_module("q_proj", layer_projection(c.hidden_size, num_heads_ * head_dim_, options, hidden));
  k_proj_ = register_module("k_proj", layer_projection(c.hidden_size, num_kv_heads_ * head_dim_, options, hidden));
  v_proj_ = register_module("v_proj", layer_projection(c.hidden_size, num_kv_heads_ * head_dim_, options, hidden));
  o_proj_ = register_module("o_proj", layer_projection(num_heads_ * head_dim_, c.hidden_size, options));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RopeTables& rope) {
  return tp_.leave(attend(project_into_tensor_parallel(tp_, x, {q_proj_, k_proj_, v_proj_}), rope, nullptr, 0));
}

torch::Tensor AttentionImpl::forward_cached(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache,
                                            int64_t start) {
  if (tp_) throw std::invalid_argument("cached decoding runs without tensor parallelism");
  return attend({q_proj_(x), k_proj_(x), v_proj_(x)}, rope, &cache, start);
}

AttentionCache AttentionImpl::empty_cache(int64_t batch, int64_t capacity) const {
  AttentionCache cache;
  cache.keys = torch::zeros({batch, num_kv_heads_, capacity, head_dim_}, k_proj_->weight.options());
  cache.values = torch::zeros_like(cache.keys);
  return cache;
}

torch::Tensor AttentionImpl::attend(const Tensors& projected, const RopeTables& rope, AttentionCache* cache,
                                    int64_t start) {
  const int64_t batch = projected[0].size(0), seq = projected[0].size(1);
  const torch::Tensor out = attention_core(projected, rope, cache, start);  // [B, H, S, d]
  return o_proj_(out.transpose(1, 2).reshape({batch, seq, num_heads_ * head_dim_}));
}

torch::Tensor AttentionImpl::attention_core(const Tensors& projected, const RopeTables& rope, AttentionCache* cache,
                                            int64_t start) {
  const int64_t batch = projected[0].size(0), seq = projected[0].size(1);
  auto heads = [&](const torch::Tensor& t, int64_t n) {
    return t.view({batch, seq, n, head_dim_}).transpose(1, 2);  // [B, n, S, d]
  };
  torch::Tensor q = apply_rope(heads(projected[0], num_heads_), rope);
  torch::Tensor k = apply_rope(heads(projected[1], num_kv_heads_), rope);
  torch::Tensor v = heads(projected[2], num_kv_heads_);
  if (cache) {  // the new positions join the cache; the queries see all of it
    cache->keys.narrow(2, start, seq).copy_(k);
    cache->values.narrow(2, start, seq).copy_(v);
    k = cache->keys.narrow(2, 0, start + seq);
    v = cache->values.narrow(2, 0, start + seq);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  if (cp_ && !cache) {  // the key-value heads go around the ring, expanded to the query heads where they arrive
    auto keys_values = [this](const torch::Tensor& kv) {
      return std::make_pair(for_query_heads(kv.select(0, 0)), for_query_heads(kv.select(0, 1)));
    };
    return ring_attention({q, torch::stack({k, v}), keys_values, {}, scale}, *cp_);
  }
  return causal_attention(q, for_query_heads(k), for_query_heads(v), scale, selective_);  // [B, H, S, d]
}

torch::Tensor AttentionImpl::forward_decode(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache,
                                            const DecodeStep& step) {
  using torch::indexing::Slice;
  if (tp_) throw std::invalid_argument("batched decoding runs without tensor parallelism");
  const int64_t batch = x.size(0);
  auto heads = [&](const torch::Tensor& t, int64_t n) { return t.view({batch, 1, n, head_dim_}).transpose(1, 2); };
  const torch::Tensor q = apply_rope(heads(q_proj_(x), num_heads_), rope);  // [B, H, 1, d]
  const torch::Tensor key = apply_rope(heads(k_proj_(x), num_kv_heads_), rope);
  const torch::Tensor value = heads(v_proj_(x), num_kv_heads_);
  cache.keys.index_put_({step.rows, Slice(), step.positions}, key.select(2, 0));  // row b's at its own position
  cache.values.index_put_({step.rows, Slice(), step.positions}, value.select(2, 0));
  const torch::Tensor k = cache.keys.narrow(0, 0, batch).narrow(2, 0, step.keys);
  const torch::Tensor v = cache.values.narrow(0, 0, batch).narrow(2, 0, step.keys);
  const torch::Tensor out = compat::masked_attention(q, for_query_heads(k), for_query_heads(v), step.visible,
                                                     1.0 / std::sqrt(static_cast<double>(head_dim_)));
  return o_proj_(out.transpose(1, 2).reshape({batch, 1, num_heads_ * head_dim_}));
}

torch::Tensor AttentionImpl::for_query_heads(const torch::Tensor& kv) const {
  // Key/value head j serves query heads j × group ... (j + 1) × group - 1, as in HF repeat_kv.
  return num_kv_heads_ == num_heads_ ? kv : kv.repeat_interleave(num_heads_ / num_kv_heads_, /*dim=*/1);
}

SwiGLUImpl::SwiGLUImpl(int64_t hidden, int64_t intermediate, const ComputeOptions& options)
    : selective_(options.selective()),
      cuda_kernels_(options.cuda_kernels),
      tp_{options.tensor_parallel, options.sequence_parallel} {
  const int64_t width = split_by_tensor_parallel(intermediate, tp_.group, "the MLP's intermediate size");
  const auto input = std::make_shared<Fp8InputShare>();  // gate and up read the same input
  gate_proj_ = register_module("gate_proj", layer_projection(hidden, width, options, input));
  up_proj_ = register_module("up_proj", layer_projection(hidden, width, options, input));
  down_proj_ = register_module("down_proj", layer_projection(width, hidden, options));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  const std::vector<torch::Tensor> gate_up = project_into_tensor_parallel(tp_, x, {gate_proj_, up_proj_});
  return tp_.leave(down(gate_up[0], gate_up[1]));
}

torch::Tensor SwiGLUImpl::down(const torch::Tensor& gate, const torch::Tensor& up) {
  if (!selective_.on) return down_proj_(swiglu_activation(gate, up, cuda_kernels_));
  // Selective recomputation: the activation is computed again in the backward pass, not kept.
  const bool kernel = cuda_kernels_;
  return recompute_outputs([kernel](const Tensors& in) { return Tensors{swiglu_activation(in[0], in[1], kernel)}; },
                           {gate, up}, [this](const Tensors& activation) { return Tensors{down_proj_(activation[0])}; },
                           selective_.clock)[0];
}

}  // namespace dstrain
