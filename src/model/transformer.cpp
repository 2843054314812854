#include "dstrain/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

#include "dstrain/core/profile_scope.h"
#include "dstrain/core/random.h"
#include "dstrain/core/text.h"
#include "dstrain/model/context_parallel.h"
#include "dstrain/model/grouped_experts.h"
#include "dstrain/model/linear_cross_entropy.h"
#include "dstrain/model/parameter_shapes.h"

namespace dstrain {

DecoderStackImpl::DecoderStackImpl(const ModelConfig& c, const LayerSlice& slice, const ComputeOptions& options)
    : slice_(slice),
      cp_(options.context_parallel),
      sequence_parts_(options.tensor_parallel && options.sequence_parallel ? options.tensor_parallel->size() : 1),
      recompute_(options.recompute),
      rerun_clock_(options.rerun_clock),
      max_seq_len_(c.max_seq_len),
      rope_(make_rope_tables(c.max_seq_len, c.rope_dim(), c.rope_theta, c.rope_interleave,
                             YarnScaling{c.rope_scaling_factor, c.rope_original_max_seq_len, c.rope_beta_fast,
                                         c.rope_beta_slow, c.rope_mscale, c.rope_mscale_all_dim})) {
  // Buffers move with the module to its device (and stay fp32: only parameters change dtype).
  rope_.cos = register_buffer("rope_cos", rope_.cos);
  rope_.sin = register_buffer("rope_sin", rope_.sin);
  rope_.cuda_kernel = options.cuda_kernels;
  if (slice.has_embedding)
    embed_tokens_ =
        register_module("embed_tokens", TokenEmbedding(c.vocab_size, c.hidden_size,
                                                       TensorParallelRegion{options.tensor_parallel,
                                                                            options.sequence_parallel}));
  // Layers keep their global index as their name, so a slice's names are the whole model's.
  auto layers = std::make_shared<torch::nn::Module>();
  for (int64_t i = slice.first; i < slice.last; ++i)
    layers_.push_back(layers->register_module(std::to_string(i), DecoderLayer(c, i, options)));
  // The multi-token prediction modules follow the last layer, on the stage of the head. Their
  // sequences (S - k positions) need not split over a tp group: they hold the whole sequence.
  ComputeOptions ahead = options;
  ahead.sequence_parallel = false;
  if (slice.has_head)
    for (int64_t i = c.num_layers; i < c.num_layers + c.num_nextn_predict_layers; ++i)
      mtp_.push_back(layers->register_module(std::to_string(i), MultiTokenPrediction(c, i, ahead)));
  register_module("layers", layers);
  if (slice.has_head) norm_ = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderStackImpl::run_layer(DecoderLayerImpl& layer, int64_t index, const torch::Tensor& input,
                                          const RopeTables& rope) {
  if (!recompute_.reruns_layer(index)) return layer.forward(input, rope);
  return recompute_in_backward(
      [&layer, rope](const torch::Tensor& x, Pass pass) { return layer.forward(x, rope, pass); }, input, rerun_clock_);
}

RopeTables DecoderStackImpl::context_rope(int64_t positions) const {
  const int64_t n = positions / 2;
  const auto [first, second] = context_chunks_of(cp_->rank(), cp_->size());
  const RopeTables a = rope_tables_from(rope_, first * n, n), b = rope_tables_from(rope_, second * n, n);
  return {torch::cat({a.cos, b.cos}), torch::cat({a.sin, b.sin}), rope_.interleave, rope_.cuda_kernel};
}

torch::Tensor DecoderStackImpl::forward_layers(torch::Tensor h) {
  const RopeTables rope = cp_ ? context_rope(h.size(1) * sequence_parts_) : rope_;
  for (size_t i = 0; i < layers_.size(); ++i) h = run_layer(*layers_[i], static_cast<int64_t>(i), h, rope);
  return slice_.has_head ? norm_(h) : h;
}

torch::Tensor DecoderStackImpl::predict_ahead(int64_t depth, const torch::Tensor& previous,
                                              const torch::Tensor& embedded) {
  // The module's decoder layer follows the chunk's last one, and is recomputed as those are.
  MultiTokenPrediction module = mtp_.at(static_cast<size_t>(depth - 1));
  const RopeTables rope = cp_ ? context_rope(previous.size(1)) : rope_;  // (the module's input is never split by tp)
  return run_layer(*module, static_cast<int64_t>(layers_.size()) + depth - 1, module->join(previous, embedded), rope);
}

torch::Tensor DecoderStackImpl::mtp_head_input(int64_t depth, const torch::Tensor& hidden) {
  return mtp_.at(static_cast<size_t>(depth - 1))->head_input(hidden);
}

KvCache DecoderStackImpl::empty_cache(int64_t batch) const {
  // The main model's layers only: the multi-token prediction modules do not decode.
  KvCache cache;
  for (const DecoderLayer& layer : layers_) cache.layers.push_back(layer->empty_cache(batch, max_seq_len_));
  return cache;
}

torch::Tensor DecoderStackImpl::forward_cached(const torch::Tensor& input, KvCache& cache) {
  const int64_t start = cache.length, n = input.size(1);
  if (start + n > max_seq_len_)
    throw std::out_of_range("cached decoding past model.max_seq_len (" + std::to_string(max_seq_len_) + ")");
  if (cache.layers.size() != layers_.size())
    throw std::invalid_argument("cached decoding: the cache is not this model's (empty_cache makes one)");
  const RopeTables rope = rope_tables_from(rope_, start, n);
  torch::Tensor h = slice_.has_embedding ? embed_tokens_(input) : input;
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward_cached(h, rope, cache.layers[i], start);
  cache.length = start + n;
  return slice_.has_head ? norm_(h) : h;
}

namespace {

int64_t cache_rows(const AttentionCache& cache) { return (cache.keys.defined() ? cache.keys : cache.latent).size(0); }

}  // namespace

torch::Tensor DecoderStackImpl::forward_decode(const torch::Tensor& ids, KvCache& cache,
                                              const std::vector<int64_t>& positions) {
  const int64_t batch = ids.size(0);
  if (ids.dim() != 2 || ids.size(1) != 1 || static_cast<int64_t>(positions.size()) != batch)
    throw std::invalid_argument("batched decoding: one token and one position a row");
  if (cache.layers.size() != layers_.size() || (!layers_.empty() && cache_rows(cache.layers.front()) < batch))
    throw std::invalid_argument("batched decoding: the cache is not this model's or has fewer rows than the batch");
  for (int64_t position : positions)
    if (position < 0 || position >= max_seq_len_)
      throw std::out_of_range("batched decoding past model.max_seq_len (" + std::to_string(max_seq_len_) + ")");
  const auto on_device = torch::dtype(torch::kLong).device(ids.device());
  DecodeStep step;
  step.rows = torch::arange(batch, on_device);
  step.positions = torch::tensor(positions, torch::kLong).to(ids.device());
  step.keys = *std::max_element(positions.begin(), positions.end()) + 1;
  step.visible = (torch::arange(step.keys, on_device).unsqueeze(0) <= step.positions.unsqueeze(1)).view(
      {batch, 1, 1, step.keys});
  const RopeTables rope = rope_tables_at(rope_, step.positions.to(rope_.cos.device()));
  torch::Tensor h = embed_tokens_(ids);
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward_decode(h, rope, cache.layers[i], step);
  return norm_(h);
}

CausalLMImpl::CausalLMImpl(const ModelConfig& c, const LayerSlice& slice, const ComputeOptions& options)
    : config_(c),
      slice_(slice),
      cuda_kernels_(options.cuda_kernels),
      carries_embeddings_(c.num_nextn_predict_layers > 0 && !(slice.has_embedding && slice.has_head)),
      tp_{options.tensor_parallel, options.sequence_parallel},
      cp_(options.context_parallel) {
  model_ = register_module("model", DecoderStack(c, slice, options));
  if (slice.has_head)
    lm_head_ = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(
                                         c.hidden_size, split_by_tensor_parallel(c.vocab_size, tp_.group, "model.vocab_size"))
                                         .bias(false)));
}

int64_t CausalLMImpl::stage_activation_width(const ModelConfig& c, int virtual_stages) {
  return c.num_nextn_predict_layers > 0 && virtual_stages > 1 ? 2 * c.hidden_size : c.hidden_size;
}

std::vector<std::pair<int64_t, MoE>> CausalLMImpl::moe_layers() const {
  std::vector<std::pair<int64_t, MoE>> moe;
  int64_t index = slice_.first;
  for (const DecoderLayer& layer : model_->layers()) {
    if (layer->moe()) moe.emplace_back(index, layer->moe());
    ++index;
  }
  for (const MultiTokenPrediction& module : model_->mtp_modules()) {
    if (module->moe()) moe.emplace_back(index, module->moe());
    ++index;
  }
  return moe;
}

std::pair<torch::Tensor, torch::Tensor> CausalLMImpl::hidden_and_embeddings(const torch::Tensor& input) {
  torch::Tensor hidden, embeddings;
  if (slice_.has_embedding) {
    hidden = model_->embed(cp_ ? context_parallel_part(input, *cp_, 1) : input);
    // Kept for the MTP modules of this slice or of the last stage.
    if (config_.num_nextn_predict_layers > 0) embeddings = hidden;
  } else if (carries_embeddings_) {
    const int64_t h = config_.hidden_size;
    hidden = input.narrow(-1, 0, h);
    embeddings = input.narrow(-1, h, h);
  } else {
    hidden = input;
  }
  return {model_->forward_layers(hidden), embeddings};
}

torch::Tensor CausalLMImpl::forward(const torch::Tensor& input) {
  auto [hidden, embeddings] = hidden_and_embeddings(input);
  if (slice_.has_head) {
    if (cp_) throw std::invalid_argument("under context parallelism the model trains through losses()");
    if (!tp_) return lm_head_(hidden);
    // The whole logits, gathered: for evaluation and inspection (training takes losses()).
    if (torch::GradMode::is_enabled())
      throw std::invalid_argument("under tensor parallelism the logits are for inference; train through losses()");
    const torch::Tensor whole = tp_.sequence_parallel ? tp_.group->all_gather(hidden, 1) : hidden;
    return tp_.group->all_gather(lm_head_(whole), -1);
  }
  return carries_embeddings_ ? torch::cat({hidden, embeddings}, -1) : hidden;
}

LanguageModelLosses CausalLMImpl::losses(const torch::Tensor& input, const torch::Tensor& tokens, bool with_mtp) {
  auto [hidden, embeddings] = hidden_and_embeddings(input);
  // (With sequence parallelism the hidden states are this rank's part of the sequence.)
  const bool sequence_parallel = tp_ && tp_.sequence_parallel;
  const int64_t seq = hidden.size(1) * (sequence_parallel ? tp_.group->size() : 1);
  // Under context parallelism: this rank's chunks of the sequence, whose targets are the tokens after them.
  const torch::Tensor targets =
      cp_ ? context_parallel_part(tokens.narrow(1, 1, seq * cp_->size()), *cp_, 1) : tokens.narrow(1, 1, seq);
  LanguageModelLosses losses;
  losses.next_token = head_loss(hidden, targets, tp_);
  if (!with_mtp || config_.num_nextn_predict_layers == 0) return losses;
  // The modules compute on the whole sequence (their layers are not sequence-parallel).
  if (sequence_parallel) {
    hidden = gather_sequence_whole(hidden, *tp_.group, 1);
    embeddings = gather_sequence_whole(embeddings, *tp_.group, 1);
  }
  losses.mtp = multi_token_loss(hidden, embeddings, tokens, seq);
  return losses;
}

torch::Tensor CausalLMImpl::multi_token_loss(torch::Tensor hidden, const torch::Tensor& embeddings,
                                             const torch::Tensor& tokens, int64_t seq) {
  const int64_t depths = config_.num_nextn_predict_layers;
  const TensorParallelRegion whole{tp_.group, false};
  // Depth k sees positions 0 .. S-1-k: the embedding of t_{i+k} (an input position, so the
  // first stage's embeddings hold it) and predicts t_{i+k+1}. Depth 1 starts from the main
  // model's normalised output, depth k + 1 from depth k's decoder layer output. Under context
  // parallelism every depth computes on this rank's chunks whole, the embeddings k places on
  // coming partly from the ranks holding the next chunks.
  if (cp_ ? seq / 2 < depths : seq <= depths)
    throw std::invalid_argument("multi-token prediction needs " +
                                std::string(cp_ ? "context-parallel chunks at least" : "sequences longer than") +
                                " num_nextn_predict_layers");
  torch::Tensor sum;
  for (int64_t k = 1; k <= depths; ++k) {
    torch::Tensor loss;
    if (cp_) {
      hidden = model_->predict_ahead(k, hidden, context_parallel_ahead(embeddings, k, *cp_));
      loss = context_parallel_ahead_loss(k, model_->mtp_head_input(k, hidden), tokens, whole);
    } else {
      const int64_t n = seq - k;
      hidden = model_->predict_ahead(k, hidden.narrow(1, 0, n), embeddings.narrow(1, k, n));
      loss = head_loss(model_->mtp_head_input(k, hidden), tokens.narrow(1, k + 1, n), whole);
    }
    sum = sum.defined() ? sum + loss : loss;
  }
  return sum / static_cast<double>(depths);
}

torch::Tensor CausalLMImpl::context_parallel_ahead_loss(int64_t depth, const torch::Tensor& head_input,
                                                        const torch::Tensor& tokens,
                                                        const TensorParallelRegion& region) {
  const int64_t held = head_input.size(1), whole = held * cp_->size(), predicted = whole - depth;
  // Position i's target is t_{i+depth+1}; the last `depth` positions have none (any token stands
  // in for it until they are cut off, on the rank that holds them).
  const torch::Tensor ahead = torch::cat({tokens.narrow(1, depth + 1, predicted), tokens.narrow(1, 0, depth)}, 1);
  const int64_t kept = held - context_parallel_tail(*cp_, depth);
  const torch::Tensor mean = head_loss(head_input.narrow(1, 0, kept),
                                       context_parallel_part(ahead, *cp_, 1).narrow(1, 0, kept), region);
  // This rank's sum over the whole sequence's count, times cp: the ranks' average is the mean.
  return mean * (static_cast<double>(kept * cp_->size()) / static_cast<double>(predicted));
}

torch::Tensor CausalLMImpl::head_loss(const torch::Tensor& hidden, const torch::Tensor& targets,
                                      const TensorParallelRegion& region) {
  ProfileScope scope(profile_part::kLoss);
  if (!region) return linear_cross_entropy(hidden, lm_head_->weight, targets, 0, cuda_kernels_);
  // The head is column-parallel: its input enters as any split layer's does (the whole sequence).
  const torch::Tensor logits = torch::matmul(region.enter(hidden), lm_head_->weight.t());
  return vocab_parallel_cross_entropy(logits.flatten(0, -2), targets.flatten(), *region.group);
}

torch::Tensor CausalLMImpl::forward_cached(const torch::Tensor& input, KvCache& cache) {
  torch::Tensor h = model_->forward_cached(input, cache);
  return slice_.has_head ? lm_head_(h) : h;
}

torch::Tensor CausalLMImpl::forward_decode(const torch::Tensor& ids, KvCache& cache,
                                          const std::vector<int64_t>& positions) {
  if (!slice_.has_embedding || !slice_.has_head || slice_.first != 0 || slice_.last < config_.num_layers)
    throw std::invalid_argument("batched decoding needs the whole model");
  return lm_head_(model_->forward_decode(ids, cache, positions));
}

namespace {

void sort_by_name(std::vector<std::pair<std::string, torch::Tensor>>& params) {
  std::sort(params.begin(), params.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
}

}  // namespace

void initialize_parameters(torch::nn::Module& model, const ModelConfig& config, uint64_t seed,
                           const TensorParallelGroup* tensor_parallel) {
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
    const int64_t split = tensor_parallel ? tensor_parallel_dim(name) : -1;
    std::vector<int64_t> shape = param.sizes().vec();
    if (split >= 0) shape[static_cast<size_t>(split)] *= tensor_parallel->size();
    torch::Tensor values = torch::empty(shape, torch::kFloat32);
    values.normal_(0.0, output ? output_std : config.init_std, generator);
    if (split >= 0) values = values.narrow(split, tensor_parallel->rank() * param.size(split), param.size(split));
    param.copy_(values);
  }
}

void cast_parameters(torch::nn::Module& model, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    torch::Tensor& p = item.value();
    const torch::ScalarType wanted = parameter_dtype(item.key(), dtype);
    if (p.scalar_type() != wanted) p.set_data(p.data().to(wanted));
  }
}

std::vector<std::pair<std::string, torch::Tensor>> sorted_parameters(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  std::set<std::string> stacked;  // given per expert instead
  for (const auto& item : model.named_modules()) {
    const auto* experts = item.value()->as<GroupedExpertsImpl>();
    if (!experts) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& [name, view] : experts->expert_weights()) params.emplace_back(prefix + name, view);
    for (const auto& own : experts->named_parameters(/*recurse=*/false)) stacked.insert(prefix + own.key());
  }
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    if (stacked.count(item.key()) == 0) params.emplace_back(item.key(), item.value());
  sort_by_name(params);
  return params;
}

std::vector<std::pair<std::string, torch::Tensor>> module_parameters(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) params.emplace_back(item.key(), item.value());
  sort_by_name(params);
  return params;
}

}  // namespace dstrain
