#include "dstrain/model/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <stdexcept>

namespace dstrain {
namespace {

torch::Device device_of(const CausalLM& model) {
  const auto params = model->parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

}  // namespace

CachedDecoder::CachedDecoder(CausalLM model) : model_(std::move(model)), device_(device_of(model_)) {
  const ModelConfig& c = model_->config();
  const LayerSlice& slice = model_->slice();
  if (!slice.has_embedding || !slice.has_head || slice.first != 0 || slice.last < c.num_layers)
    throw std::invalid_argument("CachedDecoder needs the whole model (embedding, every layer, head)");
  model_->eval();
}

torch::Tensor CachedDecoder::forward(const torch::Tensor& ids, KvCache& cache) const {
  torch::NoGradGuard no_grad;
  return model_.ptr()->forward_cached(ids, cache);  // (LibTorch modules' forward is not const)
}

torch::Tensor CachedDecoder::decode(const torch::Tensor& ids, KvCache& cache,
                                   const std::vector<int64_t>& positions) const {
  torch::NoGradGuard no_grad;
  return model_.ptr()->forward_decode(ids, cache, positions);
}

KvCache cache_row(const KvCache& cache, int64_t row) {
  auto row_of = [row](const torch::Tensor& t) { return t.defined() ? t.narrow(0, row, 1) : t; };
  KvCache view;
  for (const AttentionCache& layer : cache.layers)
    view.layers.push_back({row_of(layer.keys), row_of(layer.values), row_of(layer.latent), row_of(layer.rope_key)});
  return view;
}

int64_t sample_token(const torch::Tensor& logits, const SamplingOptions& options, at::Generator& generator) {
  torch::Tensor scores = logits.detach().to(torch::kCPU, torch::kFloat32).reshape({-1});
  if (options.temperature <= 0) return scores.argmax().item<int64_t>();
  scores = scores / options.temperature;
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  if (options.top_k > 0 && options.top_k < scores.size(0)) {
    const float kth = std::get<0>(scores.topk(options.top_k)).min().item<float>();
    scores = scores.masked_fill(scores < kth, minus_infinity);
  }
  if (options.top_p < 1.0) {
    auto [sorted, order] = scores.sort(/*dim=*/0, /*descending=*/true);
    torch::Tensor probs = torch::softmax(sorted, 0);
    // A token stays when the tokens more likely than it have not yet reached top_p: the most
    // likely one always stays.
    torch::Tensor before = probs.cumsum(0) - probs;
    torch::Tensor dropped_sorted = before >= options.top_p;
    torch::Tensor dropped = torch::zeros_like(dropped_sorted).scatter(0, order, dropped_sorted);
    scores = scores.masked_fill(dropped, minus_infinity);
  }
  torch::Tensor probs = torch::softmax(scores, 0);
  return torch::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>();
}

std::vector<int64_t> generate(const CachedDecoder& decoder, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options) {
  const ModelConfig& c = decoder.config();
  if (prompt.empty() || static_cast<int64_t>(prompt.size()) >= c.max_seq_len)
    throw std::invalid_argument("generate: the prompt needs 1 to max_seq_len - 1 tokens");
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const torch::Device device = decoder.forward_device();
  KvCache cache = decoder.empty_cache();
  // The prompt at once, then a token a step, decoded as a batch of one (as `dstrain serve`
  // decodes each of its rows), so that both give the same tokens.
  torch::Tensor logits = decoder.forward(torch::tensor(prompt, torch::kLong).unsqueeze(0).to(device), cache)[0][-1];
  int64_t position = static_cast<int64_t>(prompt.size());  // the positions the cache holds
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < options.max_new_tokens) {
    const int64_t token = sample_token(logits, options, generator);
    out.push_back(token);
    if (token == options.stop_token || position >= c.max_seq_len) break;
    const torch::Tensor next = torch::full({1, 1}, token, torch::dtype(torch::kLong).device(device));
    logits = decoder.decode(next, cache, {position})[0][0];
    ++position;
  }
  return out;
}

}  // namespace dstrain
