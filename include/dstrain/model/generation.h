// Text generation from a whole model (every layer, embedding and head), dense, MLA or MoE: the
// prompt once, then one token at a time, each step attending to the earlier positions kept in a
// KV cache (kv_cache.h) instead of recomputing them. The model's own modules compute each step
// (their forward_cached), so decoding is the training forward pass in eval mode, not a copy of it.
// Sampling: temperature, top-k, top-p (nucleus), from a seeded generator on the CPU, so that a
// seed gives the same text on the CPU and on a GPU up to the logits' rounding; temperature 0 is
// greedy decoding, deterministic.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <vector>

#include "dstrain/model/kv_cache.h"
#include "dstrain/model/transformer.h"

namespace dstrain {

struct SamplingOptions {
  double temperature = 1.0;    // 0: greedy (the most likely token)
  int64_t top_k = 0;           // keep the k most likely tokens; 0: all
  double top_p = 1.0;          // keep the fewest most likely tokens whose probability reaches p
  int64_t max_new_tokens = 64;
  uint64_t seed = 0;
  int64_t stop_token = -1;     // generation ends after this token (end of document); -1: none
};

class CachedDecoder {
 public:
  // `model` must hold the whole model (LayerSlice::whole); its parameters are used as they are,
  // and it is put in eval mode (MoE layers count no expert load and attach no balance loss).
  explicit CachedDecoder(CausalLM model);
  KvCache empty_cache(int64_t rows = 1) const { return model_->empty_cache(rows); }
  // Logits [B, n, vocab] of `ids` [B, n] at positions cache.length ... + n - 1; appends what
  // attention keeps of them to the cache (the prompt, read at once).
  torch::Tensor forward(const torch::Tensor& ids, KvCache& cache) const;
  // Logits [B, 1, vocab] of one new token a row, `ids` [B, 1], row b's at positions[b], its cache
  // in the cache's row b (CausalLMImpl::forward_decode): sequences of any length side by side.
  torch::Tensor decode(const torch::Tensor& ids, KvCache& cache, const std::vector<int64_t>& positions) const;
  const ModelConfig& config() const { return model_->config(); }
  torch::Device forward_device() const { return device_; }

 private:
  CausalLM model_;
  torch::Device device_;
};

// Row `row` of a batched cache as a cache of its own (views: what is written into it lands in the
// batched cache), empty: a new sequence's prompt is read into it with CachedDecoder::forward.
KvCache cache_row(const KvCache& cache, int64_t row);

// The next token drawn from last-position logits [vocab] (any device and dtype).
int64_t sample_token(const torch::Tensor& logits, const SamplingOptions& options, at::Generator& generator);

// The prompt's continuation (new tokens only). Stops after max_new_tokens, after stop_token, or
// when the model's max_seq_len is reached. The prompt must be shorter than max_seq_len.
std::vector<int64_t> generate(const CachedDecoder& decoder, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options);

}  // namespace dstrain
