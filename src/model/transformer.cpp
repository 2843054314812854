#include "dstrain/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "dstrain/core/random.h"

namespace dstrain {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

DecoderStackImpl::DecoderStackImpl(const ModelConfig& c, const LayerSlice& slice)
    : slice_(slice), rope_(make_rope_tables(c.max_seq_len, c.rope_dim(), c.rope_theta, c.rope_interleave,
                                        YarnScaling{c.rope_scaling_factor, c.rope_original_max_seq_len, c.rope_beta_fast,
                                                    c.rope_beta_slow, c.rope_mscale, c.rope_mscale_all_dim})) {
  // Buffers move with the module to its device (and stay fp32: only parameters change dtype).
  rope_.cos = register_buffer("rope_cos", rope_.cos);
  rope_.sin = register_buffer("rope_sin", rope_.sin);
  if (slice.has_embedding)
    embed_tokens_ = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  // Layers keep their global index as their name, so a slice's names are the whole model's.
  auto layers = std::make_shared<torch::nn::Module>();
  for (int64_t i = slice.first; i < slice.last; ++i)
    layers_.push_back(layers->register_module(std::to_string(i), DecoderLayer(c, i)));
  register_module("layers", layers);
  if (slice.has_head) norm_ = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderStackImpl::forward(const torch::Tensor& input) {
  torch::Tensor h = slice_.has_embedding ? embed_tokens_(input) : input;
  for (DecoderLayer& layer : layers_) h = layer(h, rope_);
  return slice_.has_head ? norm_(h) : h;
}

CausalLMImpl::CausalLMImpl(const ModelConfig& c, const LayerSlice& slice) : config_(c), slice_(slice) {
  model_ = register_module("model", DecoderStack(c, slice));
  if (slice.has_head)
    lm_head_ = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
}

std::vector<std::pair<int64_t, MoE>> CausalLMImpl::moe_layers() const {
  std::vector<std::pair<int64_t, MoE>> moe;
  int64_t index = slice_.first;
  for (const DecoderLayer& layer : model_->layers()) {
    if (layer->moe()) moe.emplace_back(index, layer->moe());
    ++index;
  }
  return moe;
}

torch::Tensor CausalLMImpl::forward(const torch::Tensor& input) {
  torch::Tensor h = model_(input);
  return slice_.has_head ? lm_head_(h) : h;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  // log-softmax in fp32 from bf16/fp16 logits in one kernel (and its backward back to the
  // logits' dtype in one): no fp32 copy of the [tokens, vocabulary] logits is made.
  torch::Tensor log_probs = torch::log_softmax(logits.reshape({-1, logits.size(-1)}), -1, torch::kFloat32);
  return torch::nll_loss(log_probs, targets.reshape({-1}));
}

void initialize_parameters(torch::nn::Module& model, const ModelConfig& config, uint64_t seed) {
  torch::NoGradGuard no_grad;
  const double output_std = config.init_std / std::sqrt(2.0 * config.num_layers);
  for (auto& [name, param] : sorted_parameters(model)) {
    if (ends_with(name, "norm.weight")) {
      param.fill_(1.0);
      continue;
    }
    if (ends_with(name, "e_score_correction_bias")) {
      param.zero_();
      continue;
    }
    bool output = ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight");
    auto generator = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed, hash_string(name)));
    torch::Tensor values = torch::empty(param.sizes(), torch::kFloat32);
    values.normal_(0.0, output ? output_std : config.init_std, generator);
    param.copy_(values);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> sorted_parameters(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) params.emplace_back(item.key(), item.value());
  std::sort(params.begin(), params.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return params;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& config) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const CausalLM slice(config, LayerSlice{layer, layer + 1, layer == 0, layer == config.num_layers - 1});
    for (const auto& [name, param] : sorted_parameters(*slice)) shapes.emplace_back(name, param.sizes().vec());
  }
  std::sort(shapes.begin(), shapes.end());
  return shapes;
}

}  // namespace dstrain
