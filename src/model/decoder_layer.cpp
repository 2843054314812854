#include "dstrain/model/decoder_layer.h"

#include "dstrain/core/profile_scope.h"

namespace dstrain {

// The norm uses x twice (its square and the product); the gradients of the two are summed before
// they meet the residual's, with or without recomputation (where the rerun sums them into its own
// input), so that both give the same bits.
torch::Tensor DecoderLayerImpl::through_norm(RMSNorm& norm, const torch::Tensor& x,
                                             const std::function<torch::Tensor(const torch::Tensor&)>& consumer) {
  if (!selective_.on) return consumer(norm(x.view_as(x)));
  return recompute_outputs([norm](const Tensors& in) mutable { return Tensors{norm(in[0])}; }, {x},
                           [&consumer](const Tensors& normed) { return Tensors{consumer(normed[0])}; },
                           selective_.clock)[0];
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t layer, const ComputeOptions& options,
                                   int64_t unrouted_tail)
    : selective_(options.selective()) {
  if (c.is_mla())
    latent_attention_ = register_module("self_attn", MultiHeadLatentAttention(c, options));
  else
    attention_ = register_module("self_attn", Attention(c, options));
  if (c.is_moe_layer(layer))
    moe_ = register_module("mlp", MoE(c, options, unrouted_tail));
  else
    mlp_ = register_module("mlp", SwiGLU(c.hidden_size, c.intermediate_size, options));
  input_layernorm_ = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm_ = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& input, const RopeTables& rope, Pass pass) {
  // The gradients of the layer's two uses of its input (norm, residual) are summed here, inside
  // the layer, before the sum joins those of the input's other users (multi-token prediction
  // reuses the embeddings): the grouping a recomputed layer gives them too, so that recomputation
  // changes no bit.
  const torch::Tensor x = input.view_as(input);
  return add_mlp(x + through_norm(input_layernorm_, x,
                                  [&](const torch::Tensor& normed) {
                                    ProfileScope scope(profile_part::kAttention);
                                    return latent_attention_ ? latent_attention_(normed, rope)
                                                             : attention_(normed, rope);
                                  }),
                 pass);
}

torch::Tensor DecoderLayerImpl::forward_cached(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache,
                                               int64_t start) {
  const torch::Tensor normed = input_layernorm_(x);
  return add_mlp(x + (latent_attention_ ? latent_attention_->forward_cached(normed, rope, cache, start)
                                        : attention_->forward_cached(normed, rope, cache, start)),
                 Pass::kFirst);
}

torch::Tensor DecoderLayerImpl::forward_decode(const torch::Tensor& x, const RopeTables& rope, AttentionCache& cache,
                                               const DecodeStep& step) {
  const torch::Tensor normed = input_layernorm_(x);
  return add_mlp(x + (latent_attention_ ? latent_attention_->forward_decode(normed, rope, cache, step)
                                        : attention_->forward_decode(normed, rope, cache, step)),
                 Pass::kFirst);
}

AttentionCache DecoderLayerImpl::empty_cache(int64_t batch, int64_t capacity) const {
  return latent_attention_ ? latent_attention_->empty_cache(batch, capacity) : attention_->empty_cache(batch, capacity);
}

torch::Tensor DecoderLayerImpl::add_mlp(const torch::Tensor& h, Pass pass) {
  return h + through_norm(post_attention_layernorm_, h, [this, pass](const torch::Tensor& normed) {
           ProfileScope scope(moe_ ? profile_part::kMoE : profile_part::kMlp);
           return moe_ ? moe_(normed, pass) : mlp_(normed);
         });
}

}  // namespace dstrain
