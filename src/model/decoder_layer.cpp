#include "dstrain/model/decoder_layer.h"

#include "dstrain/model/recompute.h"

namespace dstrain {
namespace {

// consumer(norm(x)); under selective recomputation the norm's output is not kept for the backward
// pass but computed again there (recompute.h). The norm uses x twice (its square and the
// product); the gradients of the two are summed before they meet the residual's, with or without
// recomputation (where the rerun sums them into its own input), so that both give the same bits.
torch::Tensor through_norm(RMSNorm& norm, const torch::Tensor& x,
                           const std::function<torch::Tensor(const torch::Tensor&)>& consumer) {
  if (!selective_recompute()) return consumer(norm(x.view_as(x)));
  return recompute_outputs([norm](const Tensors& in) mutable { return Tensors{norm(in[0])}; }, {x},
                           [&consumer](const Tensors& normed) { return Tensors{consumer(normed[0])}; })[0];
}

}  // namespace

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t layer, const ExpertShard& experts) {
  if (c.is_mla())
    latent_attention_ = register_module("self_attn", MultiHeadLatentAttention(c));
  else
    attention_ = register_module("self_attn", Attention(c));
  if (c.is_moe_layer(layer))
    moe_ = register_module("mlp", MoE(c, experts));
  else
    mlp_ = register_module("mlp", SwiGLU(c.hidden_size, c.intermediate_size));
  input_layernorm_ = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm_ = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& input, const RopeTables& rope) {
  // The gradients of the layer's two uses of its input (norm, residual) are summed here, inside
  // the layer, before the sum joins those of the input's other users (multi-token prediction
  // reuses the embeddings): the grouping a recomputed layer gives them too, so that recomputation
  // changes no bit.
  const torch::Tensor x = input.view_as(input);
  return add_mlp(x + through_norm(input_layernorm_, x, [&](const torch::Tensor& normed) {
                   return latent_attention_ ? latent_attention_(normed, rope) : attention_(normed, rope);
                 }));
}

torch::Tensor DecoderLayerImpl::forward_cached(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache,
                                               int64_t start) {
  const torch::Tensor normed = input_layernorm_(x);
  return add_mlp(x + (latent_attention_ ? latent_attention_->forward_cached(normed, rope, cache, start)
                                    : attention_->forward_cached(normed, rope, cache, start)));
}

AttentionCache DecoderLayerImpl::empty_cache(int64_t batch, int64_t capacity) const {
  return latent_attention_ ? latent_attention_->empty_cache(batch, capacity) : attention_->empty_cache(batch, capacity);
}

torch::Tensor DecoderLayerImpl::add_mlp(const torch::Tensor& h) {
  return h + through_norm(post_attention_layernorm_, h,
                          [this](const torch::Tensor& normed) { return moe_ ? moe_(normed) : mlp_(normed); });
}

}  // namespace dstrain
