#include "dstrain/model/decoder_layer.h"

namespace dstrain {

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t layer) {
  if (c.is_mla())
    latent_attention_ = register_module("self_attn", MultiHeadLatentAttention(c));
  else
    attention_ = register_module("self_attn", Attention(c));
  if (c.is_moe_layer(layer))
    moe_ = register_module("mlp", MoE(c));
  else
    mlp_ = register_module("mlp", SwiGLU(c.hidden_size, c.intermediate_size));
  input_layernorm_ = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm_ = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const RopeTables& rope) {
  const torch::Tensor normed = input_layernorm_(x);
  torch::Tensor h = x + (latent_attention_ ? latent_attention_(normed, rope) : attention_(normed, rope));
  const torch::Tensor normed_h = post_attention_layernorm_(h);
  return h + (moe_ ? moe_(normed_h) : mlp_(normed_h));
}

}  // namespace dstrain
