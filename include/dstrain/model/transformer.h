// A DeepSeek-LLM causal language model, or a contiguous slice of one: layers [first, last),
// with the embedding when the slice starts the model and the final norm + LM head when it ends
// it. Parameter names are the global Hugging Face ones whatever the slice ("model.layers.7...").
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/decoder_layer.h"
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
  const std::vector<DecoderLayer>& layers() const { return layers_; }

 private:
  LayerSlice slice_;
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

// The whole model's parameters by global name with their shapes, sorted by name: those of
// CausalLM(config, LayerSlice::whole(config)), found by building one layer at a time, so that a
// model larger than memory can be described (what an import checks its file against).
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& config);

}  // namespace dstrain
