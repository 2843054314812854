// The building blocks of a dense DeepSeek-LLM decoder layer, named as in Hugging Face
// checkpoints (self_attn.q_proj, mlp.gate_proj, ...); MLA and MoE have files of their own.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/model/compute_options.h"
#include "dstrain/model/kv_cache.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/projection.h"
#include "dstrain/model/recompute.h"
#include "dstrain/model/rope.h"
#include "dstrain/model/tensor_parallel.h"

namespace dstrain {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;
  double eps_;
};
TORCH_MODULE(RMSNorm);

// The token embedding (embed_tokens): a row of `weight` per token id. Under tensor parallelism
// each rank holds vocab / T rows, looks up the ids in its range (zeros for the others), and the
// group sums the lookups (Megatron-LM's VocabParallelEmbedding); with sequence parallelism each
// rank keeps its part of the sequence of the sum.
class TokenEmbeddingImpl : public torch::nn::Module {
 public:
  TokenEmbeddingImpl(int64_t vocab, int64_t hidden, TensorParallelRegion tp = {});
  torch::Tensor forward(const torch::Tensor& ids);

  torch::Tensor weight;  // [vocab (/ T), hidden]

 private:
  TensorParallelRegion tp_;
};
TORCH_MODULE(TokenEmbedding);

// Causal self-attention with RoPE; grouped-query when num_kv_heads < num_heads. Under tensor
// parallelism each rank holds num_heads / T query heads and num_kv_heads / T key/value heads
// (q, k, v column-parallel, o row-parallel); decoding runs without it.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config, const ComputeOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope);
  // Cached decoding: x [B, n, hidden] holds positions start .. start + n - 1 and `rope` their
  // tables (rope_tables_from); their keys and values join `cache`, and they attend to every
  // position cached so far.
  torch::Tensor forward_cached(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache, int64_t start);
  // Batched decoding: x [B, 1, hidden], row b at position step.positions[b] and `rope` its tables
  // (rope_tables_at); each row's key and value join its row of `cache`, and it attends to its own
  // cached positions.
  torch::Tensor forward_decode(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache,
                               const DecodeStep& step);
  // Keys and values for `capacity` positions (zeros), in the weights' dtype and device.
  AttentionCache empty_cache(int64_t batch, int64_t capacity) const;

 private:
  // Key/value heads repeated for the query heads they serve (grouped-query attention).
  torch::Tensor for_query_heads(const torch::Tensor& kv) const;
  // The one computation of both, from [q_proj(x), k_proj(x), v_proj(x)]: without a cache the
  // keys are x's own.
  torch::Tensor attend(const Tensors& projected, const RopeTables& rope, AttentionCache* cache, int64_t start);
  // [q_proj(x), k_proj(x), v_proj(x)] → the heads' attention outputs [B, heads, S, head_dim].
  torch::Tensor attention_core(const Tensors& projected, const RopeTables& rope, AttentionCache* cache, int64_t start);
  TensorParallelRegion tp_;  // heads split over its group (none: all here)
  ContextParallelGroup* cp_;  // the sequence's chunks over its ring (none: all here)
  int64_t num_heads_, num_kv_heads_, head_dim_;  // this rank's heads
  SelectiveRecompute selective_;
  Projection q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
};
TORCH_MODULE(Attention);

// down_proj(silu(gate_proj(x)) * up_proj(x)); under tensor parallelism each rank holds
// intermediate / T of the width (gate and up column-parallel, down row-parallel).
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t hidden, int64_t intermediate, const ComputeOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor down(const torch::Tensor& gate, const torch::Tensor& up);  // down_proj(silu(gate) · up)
  SelectiveRecompute selective_;
  bool cuda_kernels_;
  TensorParallelRegion tp_;
  Projection gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};
TORCH_MODULE(SwiGLU);

}  // namespace dstrain
