// Multi-token prediction (DeepSeek-V3 §2.2): module k (k = 1 .. D = num_nextn_predict_layers)
// predicts the token k + 1 places ahead. At position i it combines the previous depth's
// representation h_i^{k-1} (the main model's final, normalised hidden state for k = 1) with the
// embedding of token t_{i+k}:
//
//   h_i^k = layer_k( eh_proj( [enorm(Emb(t_{i+k})); hnorm(h_i^{k-1})] ) )
//   logits = lm_head( shared_head.norm(h_i^k) )
//
// for i = 0 .. S-1-k (the sequence shortens by one per depth), with the main model's embedding and
// LM head shared, and a whole decoder layer of its own. Under context parallelism the module runs
// on the whole sequence instead, each rank on its chunks (as Megatron-LM's does): its layer
// attends over the ring, positions S-k .. S-1 get no target, and its MoE routes none of them, so
// that the causal layer computes the same for every other position. Its names are DeepSeek-V3's
// Hugging Face ones: module k lives at model.layers.{num_hidden_layers + k - 1} (enorm, hnorm,
// eh_proj, shared_head.norm, and the decoder layer's self_attn, mlp, input_layernorm,
// post_attention_layernorm), so that the checkpoints of both name the same tensors. (The
// concatenation puts the embedding first, as those weights expect.)
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/model/decoder_layer.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/rope.h"

namespace dstrain {

class MultiTokenPredictionImpl : public DecoderLayerImpl {
 public:
  // `layer`: the module's global index, num_layers + k - 1 (it decides whether its MLP is MoE).
  MultiTokenPredictionImpl(const ModelConfig& config, int64_t layer, const ComputeOptions& options = {});
  // The input of the module's decoder layer (its forward gives h^k [B, n, H]): eh_proj of
  // h^{k-1} and the embeddings of the tokens k places ahead, both [B, n, H], normalised. (Apart,
  // so that recomputation may rerun the layer as it reruns the main model's.)
  torch::Tensor join(const torch::Tensor& previous, const torch::Tensor& embedded);
  // shared_head.norm: what the shared LM head reads.
  torch::Tensor head_input(const torch::Tensor& hidden) { return head_norm_(hidden); }

 private:
  RMSNorm enorm_{nullptr}, hnorm_{nullptr}, head_norm_{nullptr};
  Projection eh_proj_{nullptr};
};
TORCH_MODULE(MultiTokenPrediction);

}  // namespace dstrain
