// A DeepSeek causal language model, or a contiguous slice of one: layers [first, last),
// with the embedding when the slice starts the model and the final norm + LM head (and the
// multi-token prediction modules, when configured) when it ends it. Parameter names are the
// global Hugging Face ones whatever the slice ("model.layers.7...").
//
// With multi-token prediction under a pipeline, the last stage needs the token embeddings the
// first stage computed: the stages then pass [hidden states; embeddings] ([B, S, 2H]) from one to
// the next, the middle ones carrying the embeddings through untouched, and the gradient comes
// back the same way into the one embedding table. (Megatron-LM keeps a copy of the table on the
// last stage instead and all-reduces its gradient with the first's every step; carrying the
// embeddings needs no copy, no extra collective and no special case in the optimizer, the
// gradient reduction or the checkpoint, at the price of twice the bytes between stages.)
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/compute_options.h"
#include "dstrain/model/decoder_layer.h"
#include "dstrain/model/kv_cache.h"
#include "dstrain/model/layer_slice.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/multi_token_prediction.h"
#include "dstrain/model/recompute.h"

namespace dstrain {

// "model." in the Hugging Face names.
class DecoderStackImpl : public torch::nn::Module {
 public:
  DecoderStackImpl(const ModelConfig& config, const LayerSlice& slice, const ComputeOptions& options = {});
  // ids [B, S] (int64) when the slice has the embedding, else hidden states [B, S, H]. Returns
  // hidden states, normalised when the slice has the head.
  torch::Tensor forward(const torch::Tensor& input) { return forward_layers(slice_.has_embedding ? embed(input) : input); }
  torch::Tensor embed(const torch::Tensor& ids) { return embed_tokens_(ids); }
  // The slice's layers on hidden states [B, S, H], then the final norm when the slice has the head.
  torch::Tensor forward_layers(torch::Tensor hidden);
  // Multi-token prediction module `depth` (1 .. D) on the first n positions (under context
  // parallelism: on this rank's chunks): h^depth from h^{depth-1} and the embeddings of the tokens
  // `depth` places ahead (both [B, n, H]); and h^depth normalised for the LM head by the module's
  // shared_head.norm. (The slice has the head.)
  torch::Tensor predict_ahead(int64_t depth, const torch::Tensor& previous, const torch::Tensor& embedded);
  torch::Tensor mtp_head_input(int64_t depth, const torch::Tensor& hidden);
  // Cached decoding: `input` holds positions cache.length .. cache.length + n - 1; each layer
  // adds them to its cache and attends to every cached position; cache.length grows by n.
  // The multi-token prediction modules take no part.
  torch::Tensor forward_cached(const torch::Tensor& input, KvCache& cache);
  // Batched decoding (continuous batching): ids [B, 1], one new token for each of the cache's
  // first B rows, row b's at position positions[b] (< max_seq_len); each row attends to its own
  // positions 0 .. positions[b]. cache.length is left as it is.
  torch::Tensor forward_decode(const torch::Tensor& ids, KvCache& cache, const std::vector<int64_t>& positions);
  KvCache empty_cache(int64_t batch) const;  // room for max_seq_len positions
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  const std::vector<MultiTokenPrediction>& mtp_modules() const { return mtp_; }

 private:
  // Layer `index` of the chunk (the multi-token prediction modules' count after the last) on
  // `input`, rerun in the backward pass when full recomputation covers it.
  torch::Tensor run_layer(DecoderLayerImpl& layer, int64_t index, const torch::Tensor& input,
                          const RopeTables& rope);
  // The tables at the positions of this rank's chunks (context parallelism), `positions` of them.
  RopeTables context_rope(int64_t positions) const;

  LayerSlice slice_;
  ContextParallelGroup* cp_;  // the sequence's chunks over its ring (none: whole sequences)
  int64_t sequence_parts_;    // sequence parallelism's tp: a layer's input holds 1/T of the positions
  RecomputePlan recompute_;  // full: which layers rerun their forward pass in the backward pass
  RerunClock* rerun_clock_;
  int64_t max_seq_len_;
  RopeTables rope_;
  TokenEmbedding embed_tokens_{nullptr};
  std::vector<DecoderLayer> layers_;
  std::vector<MultiTokenPrediction> mtp_;
  RMSNorm norm_{nullptr};
};
TORCH_MODULE(DecoderStack);

// The last stage's losses for one micro-batch.
struct LanguageModelLosses {
  torch::Tensor next_token;  // mean cross-entropy of the next token (the loss reported and evaluated)
  torch::Tensor mtp;         // mean over the D modules of their mean cross-entropy; undefined without MTP
  // What the backward pass starts from: next_token + mtp_loss_weight × mtp (DeepSeek-V3 eq. 25).
  torch::Tensor total(double mtp_loss_weight) const {
    return mtp.defined() ? next_token + mtp_loss_weight * mtp : next_token;
  }
};

class CausalLMImpl : public torch::nn::Module {
 public:
  CausalLMImpl(const ModelConfig& config, const LayerSlice& slice, const ComputeOptions& options = {});
  // Logits [B, S, V] when the slice has the head, else the activation for the next stage
  // ([B, S, stage_activation_width]).
  torch::Tensor forward(const torch::Tensor& input);
  // The slice with the head only: the losses of the micro-batch `tokens` [B, S + 1] (positions
  // 0 .. S; the inputs are 0 .. S-1), the multi-token prediction ones when `with_mtp` and the
  // model has MTP modules.
  LanguageModelLosses losses(const torch::Tensor& input, const torch::Tensor& tokens, bool with_mtp);
  // The width of the activation pipeline stages exchange: H, or 2H when they carry the token
  // embeddings to the multi-token prediction modules.
  static int64_t stage_activation_width(const ModelConfig& config, int virtual_stages);
  // The same from a KV cache (DecoderStackImpl::forward_cached): logits of positions
  // cache.length ... + n - 1 only, the earlier ones read from the cache.
  torch::Tensor forward_cached(const torch::Tensor& input, KvCache& cache);
  // Logits [B, 1, V] of batched decoding (DecoderStackImpl::forward_decode).
  torch::Tensor forward_decode(const torch::Tensor& ids, KvCache& cache, const std::vector<int64_t>& positions);
  KvCache empty_cache(int64_t batch) const { return model_->empty_cache(batch); }
  const ModelConfig& config() const { return config_; }
  const LayerSlice& slice() const { return slice_; }
  // The MoE layers of this slice with their global layer index (empty for a dense model).
  std::vector<std::pair<int64_t, MoE>> moe_layers() const;

 private:
  // [hidden; embeddings] from the stage activation or the token ids: the embeddings are undefined
  // when nothing needs them. Then the slice's layers.
  std::pair<torch::Tensor, torch::Tensor> hidden_and_embeddings(const torch::Tensor& input);
  // The mean loss of the LM head's logits of `hidden` against `targets` (vocabulary-parallel under
  // tensor parallelism, `hidden` entering as `region` says: the full logits are never gathered).
  torch::Tensor head_loss(const torch::Tensor& hidden, const torch::Tensor& targets,
                          const TensorParallelRegion& region);
  // The mean of the multi-token prediction modules' losses, from the main model's normalised
  // output `hidden` and the embeddings of the same positions (`seq` of them, whole over tp).
  torch::Tensor multi_token_loss(torch::Tensor hidden, const torch::Tensor& embeddings, const torch::Tensor& tokens,
                                 int64_t seq);
  // Module `depth`'s loss under context parallelism, from its normalised output on this rank's
  // chunks: the whole sequence's mean over the positions that have a target, as this rank's share
  // (the cp ranks' losses are averaged).
  torch::Tensor context_parallel_ahead_loss(int64_t depth, const torch::Tensor& head_input, const torch::Tensor& tokens,
                                            const TensorParallelRegion& region);

  ModelConfig config_;
  LayerSlice slice_;
  bool cuda_kernels_;        // the loss's kernel (ComputeOptions::cuda_kernels)
  bool carries_embeddings_;  // stage activations are [hidden; embeddings]
  TensorParallelRegion tp_;  // the LM head's vocabulary split over its group (none: whole)
  ContextParallelGroup* cp_;  // the sequence's chunks over its ring (none: whole sequences)
  DecoderStack model_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};
TORCH_MODULE(CausalLM);

// Initialises every parameter from (seed, its global name) alone, so a parameter starts with the
// same values whichever rank holds it and however the model is sliced: norms at one, the rest
// normal(0, init_std), output projections (o_proj, down_proj) with std / sqrt(2 num_layers), the
// MoE balancing bias at zero. Under tensor parallelism (`tensor_parallel`, the model's group) a
// split parameter takes its rank's block of the whole tensor's values (tensor_parallel_split).
void initialize_parameters(torch::nn::Module& model, const ModelConfig& config, uint64_t seed,
                           const TensorParallelGroup* tensor_parallel = nullptr);

// Makes a bf16 or fp16 model: each parameter takes parameter_dtype(name, dtype), so the MoE
// balancing bias stays fp32; buffers (the RoPE tables) stay fp32 too.
void cast_parameters(torch::nn::Module& model, torch::ScalarType dtype);

// Parameters by global name, sorted by name: the order every checkpoint and checksum uses. Under
// the names checkpoints and Hugging Face give them: the routed experts' stacked weights as a view
// per expert (grouped_experts.h), so that what is written into one lands in the parameter. The
// optimizer updates the module's own parameters (module_parameters).
std::vector<std::pair<std::string, torch::Tensor>> sorted_parameters(const torch::nn::Module& model);
// The module's parameters as it holds them (the experts stacked), by global name, sorted.
std::vector<std::pair<std::string, torch::Tensor>> module_parameters(const torch::nn::Module& model);

}  // namespace dstrain
