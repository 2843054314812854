// A DeepSeek causal language model, or a contiguous slice of one: layers [first, last),
// with the embedding when the slice starts the model and the final norm + LM head when it ends
// it. Parameter names are the global Hugging Face ones whatever the slice ("model.layers.7...").
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/decoder_layer.h"
#include "dstrain/model/kv_cache.h"
#include "dstrain/model/layer_slice.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/model_config.h"

namespace dstrain {

// "model." in the Hugging Face names.
class DecoderStackImpl : public torch::nn::Module {
 public:
  DecoderStackImpl(const ModelConfig& config, const LayerSlice& slice);
  // ids [B, S] (int64) when the slice has the embedding, else hidden states [B, S, H]. Returns
  // hidden states, normalised when the slice has the head.
  torch::Tensor forward(const torch::Tensor& input);
  // Cached decoding: `input` holds positions cache.length .. cache.length + n - 1; each layer
  // adds them to its cache and attends to every cached position; cache.length grows by n.
  // Only the decoder layers below model.num_layers take part.
  torch::Tensor forward_cached(const torch::Tensor& input, KvCache& cache);
  KvCache empty_cache(int64_t batch) const;  // room for max_seq_len positions
  const std::vector<DecoderLayer>& layers() const { return layers_; }

 private:
  int64_t decoding_layers() const;  // the layers forward_cached runs
  LayerSlice slice_;
  int64_t num_layers_, max_seq_len_;
  RopeTables rope_;
  torch::nn::Embedding embed_tokens_{nullptr};
  std::vector<DecoderLayer> layers_;
  RMSNorm norm_{nullptr};
};
TORCH_MODULE(DecoderStack);

class CausalLMImpl : public torch::nn::Module {
 public:
  CausalLMImpl(const ModelConfig& config, const LayerSlice& slice);
  // Logits [B, S, V] when the slice has the head, else hidden states for the next stage.
  torch::Tensor forward(const torch::Tensor& input);
  // The same from a KV cache (DecoderStackImpl::forward_cached): logits of positions
  // cache.length ... + n - 1 only, the earlier ones read from the cache.
  torch::Tensor forward_cached(const torch::Tensor& input, KvCache& cache);
  KvCache empty_cache(int64_t batch) const { return model_->empty_cache(batch); }
  const ModelConfig& config() const { return config_; }
  const LayerSlice& slice() const { return slice_; }
  // The MoE layers of this slice with their global layer index (empty for a dense model).
  std::vector<std::pair<int64_t, MoE>> moe_layers() const;

 private:
  ModelConfig config_;
  LayerSlice slice_;
  DecoderStack model_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};
TORCH_MODULE(CausalLM);

// Mean next-token cross-entropy of logits [B, S, V] against targets [B, S].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

// Initialises every parameter from (seed, its global name) alone, so a parameter starts with the
// same values whichever rank holds it and however the model is sliced: norms at one, the rest
// normal(0, init_std), output projections (o_proj, down_proj) with std / sqrt(2 num_layers), the
// MoE balancing bias at zero.
void initialize_parameters(torch::nn::Module& model, const ModelConfig& config, uint64_t seed);

// Parameters by global name, sorted by name: the order every reduction and checksum uses.
std::vector<std::pair<std::string, torch::Tensor>> sorted_parameters(const torch::nn::Module& model);

}  // namespace dstrain
