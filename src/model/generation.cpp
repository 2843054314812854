#include "dstrain/model/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "dstrain/core/error.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/model/rope.h"

namespace dstrain {

CachedDecoder::CachedDecoder(CausalLM model) : model_(std::move(model)) {
  // The cached decoder computes the dense DeepSeek-LLM layer; MLA's latent cache and MoE routing
  // are not written for it yet.
  if (model_->config().is_mla() || model_->config().n_routed_experts > 0)
    throw Error(ExitCode::kUsage, "dstrain generate: models with Multi-head Latent Attention or MoE layers "
                                  "(model.kv_lora_rank, model.n_routed_experts) cannot generate yet; dense models can");
  for (auto& [name, param] : sorted_parameters(*model_)) params_[name] = param.detach();
  for (const auto& buffer : model_->named_buffers(/*recurse=*/true)) {
    if (buffer.key() == "model.rope_cos") rope_cos_ = buffer.value();
    if (buffer.key() == "model.rope_sin") rope_sin_ = buffer.value();
  }
  if (!rope_cos_.defined() || !params_.count("model.embed_tokens.weight") || !params_.count("lm_head.weight"))
    throw std::invalid_argument("CachedDecoder needs the whole model (embedding, every layer, head)");
}

torch::Tensor CachedDecoder::weight(const std::string& name) const { return params_.at(name); }

KvCache CachedDecoder::empty_cache() const {
  const ModelConfig& c = config();
  const torch::Tensor embed = weight("model.embed_tokens.weight");
  KvCache cache;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    cache.keys.push_back(torch::zeros({1, c.num_kv_heads, c.max_seq_len, c.head_dim()}, embed.options()));
    cache.values.push_back(torch::zeros({1, c.num_kv_heads, c.max_seq_len, c.head_dim()}, embed.options()));
  }
  return cache;
}

torch::Tensor CachedDecoder::forward(const torch::Tensor& ids, KvCache& cache) const {
  torch::NoGradGuard no_grad;
  const ModelConfig& c = config();
  const int64_t n = ids.size(1), start = cache.length, end = start + n, d = c.head_dim();
  if (end > c.max_seq_len) throw std::out_of_range("CachedDecoder: past model.max_seq_len");
  const torch::Tensor embed = weight("model.embed_tokens.weight");
  // The rotation of positions start .. end - 1: apply_rope rotates positions 0 .. n - 1 of the
  // tables it is given, so it is given the tables from `start` on.
  const RopeTables rope{rope_cos_.narrow(0, start, n), rope_sin_.narrow(0, start, n), c.rope_interleave};
  // Query i (position start + i) sees keys 0 .. start + i: a causal mask over the whole cache.
  const torch::Tensor key_positions = torch::arange(end, torch::dtype(torch::kLong).device(embed.device()));
  const torch::Tensor query_positions = torch::arange(start, end, torch::dtype(torch::kLong).device(embed.device()));
  const torch::Tensor hidden_future = key_positions.unsqueeze(0) > query_positions.unsqueeze(1);  // [n, end]

  torch::Tensor h = torch::embedding(embed, ids);
  const int64_t group = c.num_heads / c.num_kv_heads;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    torch::Tensor x = compat::rms_norm(h, weight(p + "input_layernorm.weight"), c.rms_norm_eps);
    auto heads = [&](const torch::Tensor& t, int64_t count) { return t.view({1, n, count, d}).transpose(1, 2); };
    torch::Tensor q = apply_rope(heads(torch::linear(x, weight(p + "self_attn.q_proj.weight")), c.num_heads), rope);
    torch::Tensor k = apply_rope(heads(torch::linear(x, weight(p + "self_attn.k_proj.weight")), c.num_kv_heads), rope);
    torch::Tensor v = heads(torch::linear(x, weight(p + "self_attn.v_proj.weight")), c.num_kv_heads);
    cache.keys[layer].narrow(2, start, n).copy_(k);
    cache.values[layer].narrow(2, start, n).copy_(v);
    torch::Tensor keys = cache.keys[layer].narrow(2, 0, end), values = cache.values[layer].narrow(2, 0, end);
    if (group > 1) {  // key/value head j serves query heads j × group ... (j + 1) × group - 1
      keys = keys.repeat_interleave(group, 1);
      values = values.repeat_interleave(group, 1);
    }
    torch::Tensor scores = torch::matmul(q, keys.transpose(-2, -1)).to(torch::kFloat32) / std::sqrt(static_cast<double>(d));
    scores = scores.masked_fill(hidden_future, -std::numeric_limits<float>::infinity());
    torch::Tensor attended = torch::matmul(torch::softmax(scores, -1).to(values.scalar_type()), values);
    h = h + torch::linear(attended.transpose(1, 2).reshape({1, n, c.num_heads * d}), weight(p + "self_attn.o_proj.weight"));
    x = compat::rms_norm(h, weight(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
    torch::Tensor mlp = torch::silu(torch::linear(x, weight(p + "mlp.gate_proj.weight"))) *
                        torch::linear(x, weight(p + "mlp.up_proj.weight"));
    h = h + torch::linear(mlp, weight(p + "mlp.down_proj.weight"));
  }
  cache.length = end;
  h = compat::rms_norm(h, weight("model.norm.weight"), c.rms_norm_eps);
  return torch::linear(h, weight("lm_head.weight"));
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
  torch::Tensor ids = torch::tensor(prompt, torch::kLong).unsqueeze(0).to(device);
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < options.max_new_tokens && cache.length + ids.size(1) <= c.max_seq_len) {
    torch::Tensor logits = decoder.forward(ids, cache);
    const int64_t token = sample_token(logits[0][-1], options, generator);
    out.push_back(token);
    if (token == options.stop_token || cache.length >= c.max_seq_len) break;
    ids = torch::full({1, 1}, token, torch::dtype(torch::kLong).device(device));
  }
  return out;
}

}  // namespace dstrain
