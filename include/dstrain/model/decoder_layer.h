// One decoder layer: x + attention(input_layernorm(x)), then h + mlp(post_attention_layernorm(h)).
// The attention is multi-head/grouped-query or Multi-head Latent Attention, the MLP dense
// (SwiGLU) or DeepSeekMoE, as the configuration says for this layer.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/model/compute_options.h"
#include "dstrain/model/kv_cache.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/mla.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/moe.h"
#include "dstrain/model/rope.h"

namespace dstrain {

class DecoderLayerImpl : public torch::nn::Module {
 public:
  // `unrouted_tail`: the MoE's (moe.h), for a multi-token prediction module under context parallelism.
  DecoderLayerImpl(const ModelConfig& config, int64_t layer, const ComputeOptions& options = {},
                   int64_t unrouted_tail = 0);
  // `pass`: its rerun inside the backward pass (full recomputation) repeats no side effect.
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope, Pass pass = Pass::kFirst);
  // The same layer in cached decoding (the attention modules' forward_cached): x holds positions
  // start .. start + n - 1, `rope` their tables. MoE layers route as forward does in the module's
  // mode (in eval mode they count no load and attach no balance loss).
  torch::Tensor forward_cached(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache, int64_t start);
  // The same in batched decoding (the attention modules' forward_decode): one token a row.
  torch::Tensor forward_decode(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache,
                               const DecodeStep& step);
  AttentionCache empty_cache(int64_t batch, int64_t capacity) const;
  MoE moe() const { return moe_; }  // null for a dense layer

 private:
  torch::Tensor add_mlp(const torch::Tensor& h, Pass pass);  // h + the MLP or MoE of its post-attention norm
  // consumer(norm(x)), the norm's output rerun in the backward pass under selective recomputation.
  torch::Tensor through_norm(RMSNorm& norm, const torch::Tensor& x,
                             const std::function<torch::Tensor(const torch::Tensor&)>& consumer);
  SelectiveRecompute selective_;
  RMSNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
  Attention attention_{nullptr};
  MultiHeadLatentAttention latent_attention_{nullptr};
  SwiGLU mlp_{nullptr};
  MoE moe_{nullptr};
};
TORCH_MODULE(DecoderLayer);

}  // namespace dstrain
