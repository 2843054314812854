#include "dstrain/model/decoder_layer.h"

namespace dstrain {

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
  const torch::Tensor normed = input_layernorm_(x);
  return add_mlp(x + (latent_attention_ ? latent_attention_(normed, rope) : attention_(normed, rope)));
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
  const torch::Tensor normed_h = post_attention_layernorm_(h);
  return h + (moe_ ? moe_(normed_h) : mlp_(normed_h));
}

}  // namespace dstrain
