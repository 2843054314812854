#include "dstrain/model/moe.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "dstrain/core/error.h"
#include "dstrain/model/context_parallel.h"

namespace dstrain {
namespace {

// The factor an auxiliary loss's gradient takes; undefined: 1. (A struct, not a tensor argument:
// autograd functions take no undefined tensors.)
struct GradientFactor {
  torch::Tensor value;
};

// Identity on `output` forward; backward, the auxiliary loss receives the gradient factor.
class AuxiliaryLossFunction : public torch::autograd::Function<AuxiliaryLossFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& output,
                               const torch::Tensor& aux, const GradientFactor& factor) {
    ctx->save_for_backward({aux});
    if (factor.value.defined()) ctx->saved_data["factor"] = factor.value;
    return output.view_as(output);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor aux = ctx->get_saved_variables()[0];
    const auto factor = ctx->saved_data.find("factor");
    torch::Tensor aux_grad = factor != ctx->saved_data.end()
                                 ? factor->second.toTensor().to(aux.options()).expand_as(aux).clone()
                                 : torch::ones_like(aux);
    return {grads[0], aux_grad, torch::Tensor()};  // (nothing for the factor)
  }
};

}  // namespace

torch::Tensor attach_auxiliary_loss(const torch::Tensor& output, const torch::Tensor& aux,
                                    const torch::Tensor& gradient_factor) {
  return AuxiliaryLossFunction::apply(output, aux, GradientFactor{gradient_factor});
}

bool is_routed_expert_parameter(const std::string& name) { return name.find("mlp.experts.") != std::string::npos; }

Routing route_tokens(const torch::Tensor& logits, const torch::Tensor& bias, const ModelConfig& c) {
  const int64_t tokens = logits.size(0), experts = logits.size(1);
  Routing r;
  r.scores = c.scoring_func == ScoringFunction::kSigmoid ? logits.sigmoid() : logits.softmax(-1);
  {
    torch::NoGradGuard no_grad;  // the choice itself is not differentiated; the weights are, below
    torch::Tensor choice = bias.defined() ? r.scores + bias : r.scores.clone();
    if (c.n_group > 1 && c.topk_method != TopkMethod::kGreedy) {
      torch::Tensor grouped = choice.view({tokens, c.n_group, experts / c.n_group});
      torch::Tensor group_score = c.topk_method == TopkMethod::kNoauxTc ? std::get<0>(grouped.topk(2, -1)).sum(-1)
                                                                        : std::get<0>(grouped.max(-1));
      torch::Tensor best_groups = std::get<1>(group_score.topk(c.topk_group, -1));
      torch::Tensor allowed = torch::zeros({tokens, c.n_group}, choice.options().dtype(torch::kBool))
                                  .scatter_(1, best_groups, true)
                                  .unsqueeze(-1)
                                  .expand({tokens, c.n_group, experts / c.n_group})
                                  .reshape({tokens, experts});
      choice = choice.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    }
    r.experts = std::get<1>(choice.topk(c.num_experts_per_tok, -1));
  }
  // Weights from the scores without the bias, and differentiable (the router learns through them).
  r.weights = r.scores.gather(1, r.experts);
  if (c.norm_topk_prob && c.num_experts_per_tok > 1) r.weights = r.weights / (r.weights.sum(-1, true) + 1e-20);
  r.weights = r.weights * c.routed_scaling_factor;
  return r;
}

torch::Tensor sequence_balance_loss(const Routing& r, int64_t sequences, const ModelConfig& c,
                                    const std::function<void(torch::Tensor&)>& sum_over_parts,
                                    int64_t sequence_length) {
  const bool parts = static_cast<bool>(sum_over_parts);
  const int64_t experts = r.scores.size(1), k = c.num_experts_per_tok;
  const int64_t per_sequence = r.scores.size(0) / sequences;  // this rank's tokens of each
  const int64_t length = parts ? sequence_length : per_sequence;
  // f: the share of the sequence's choices each expert got, scaled so that balance gives 1.
  torch::Tensor counts = torch::zeros({sequences, experts}, r.scores.options())
                             .scatter_add_(1, r.experts.view({sequences, per_sequence * k}),
                                           torch::ones({sequences, per_sequence * k}, r.scores.options()));
  if (parts) sum_over_parts(counts);  // (not differentiated: the choice is not)
  torch::Tensor f = counts * (static_cast<double>(experts) / static_cast<double>(k * length));
  torch::Tensor normalised = r.scores / r.scores.sum(-1, true);  // softmax scores already sum to 1
  torch::Tensor by_sequence = normalised.view({sequences, per_sequence, experts});
  torch::Tensor p = parts ? by_sequence.sum(1) / static_cast<double>(length) : by_sequence.mean(1);
  return (f * p).sum(-1).mean() * c.aux_loss_alpha;
}

namespace {

// Rank r's part of `length` positions split over `parts` ranks: the first length % parts ranks
// take one more (the sequences multi-token prediction's depths see need not split evenly).
std::pair<int64_t, int64_t> part_of(int64_t length, int rank, int parts) {
  const int64_t base = length / parts, extra = length % parts;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

}  // namespace

MoEImpl::MoEImpl(const ModelConfig& c, const ComputeOptions& options, int64_t unrouted_tail)
    : config_(c),
      tp_{options.tensor_parallel, options.sequence_parallel},
      cp_(options.context_parallel),
      unrouted_tail_(options.context_parallel ? unrouted_tail : 0),
      local_exchange_(options.expert_exchange ? nullptr : std::make_unique<LocalExpertExchange>()),
      exchange_(options.expert_exchange ? options.expert_exchange : local_exchange_.get()),
      shard_(exchange_->shard()) {
  auto gate = register_module("gate", std::make_shared<torch::nn::Module>());
  gate_weight_ = gate->register_parameter("weight", torch::empty({c.n_routed_experts, c.hidden_size}));
  if (c.topk_method ==
      TopkMethod::kNoauxTc)  // state, not trained by gradients: a parameter without grad, so it is checkpointed
    bias_ = gate->register_parameter("e_score_correction_bias", torch::zeros({c.n_routed_experts}),
                                     /*requires_grad=*/false);
  load_ = register_buffer("expert_load", torch::zeros({c.n_routed_experts}));
  balance_loss_ = register_buffer("balance_loss", torch::zeros({}));
  ranks_reached_ = register_buffer("ranks_reached", torch::zeros({}));
  routed_tokens_ = register_buffer("routed_tokens", torch::zeros({}));
  // Numbered from the part's first expert: in checkpoints a part's names are the whole layer's.
  experts_ =
      register_module("experts", GroupedExperts(shard_.size(c.n_routed_experts), shard_.first(c.n_routed_experts),
                                                c.hidden_size, c.moe_intermediate_size, options));
  if (c.n_shared_experts > 0)  // split by tensor parallelism as a dense MLP is
    shared_experts_ =
        register_module("shared_experts", SwiGLU(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts, options));
}

torch::Tensor MoEImpl::forward(const torch::Tensor& x, Pass pass) {
  const int64_t seq = x.size(1), context_parts = cp_ ? cp_->size() : 1;
  const int64_t sequence_parts = tp_ && tp_.sequence_parallel ? tp_.group->size() : 1;
  const int64_t whole = seq * sequence_parts * context_parts - unrouted_tail_;
  const int64_t tail = unrouted_tail_ > 0 ? context_parallel_tail(*cp_, unrouted_tail_) : 0;
  if (tail == 0) return forward_routed(x, whole, pass);
  const torch::Tensor routed = forward_routed(x.narrow(1, 0, seq - tail), whole, pass);
  return torch::cat({routed, torch::zeros_like(routed.narrow(1, 0, tail))}, 1);
}

torch::Tensor MoEImpl::forward_routed(const torch::Tensor& x, int64_t whole, Pass pass) {
  const int64_t batch = x.size(0), seq = x.size(1), hidden = x.size(2);
  const int64_t context_parts = cp_ ? cp_->size() : 1;
  torch::Tensor flat = x.reshape({batch * seq, hidden}), routed, balance;
  if (!tp_ || tp_.sequence_parallel) {  // this rank's tokens are those it holds
    routed = route_and_compute(flat, batch, whole, pass, balance);
  } else {
    // Every rank holds the whole sequence and routes its part of it. The copy's backward pass
    // sums the group's gradients of x (each has its part's); the sum joins the parts' outputs.
    TensorParallelGroup& group = *tp_.group;
    const auto [start, size] = part_of(seq, group.rank(), group.size());
    const torch::Tensor part = copy_to_tensor_parallel(x, group).narrow(1, start, size).reshape({batch * size, hidden});
    const torch::Tensor mine =
        route_and_compute(part, batch, whole, pass, balance).view({batch, size, hidden});
    auto zeros = [&](int64_t n) { return torch::zeros({batch, n, hidden}, mine.options()); };
    routed = reduce_from_tensor_parallel(torch::cat({zeros(start), mine, zeros(seq - start - size)}, 1), group)
                 .view({batch * seq, hidden});
  }
  torch::Tensor out = (shared_experts_ ? routed + shared_experts_(flat) : routed).view({batch, seq, hidden});
  if (!balance.defined()) return out;
  // Under context parallelism the gradients are averaged over the cp ranks, whose balance losses
  // are parts of one (each of its own tokens): each rank's part counts cp times, so that the
  // average is the whole loss's gradient. (tp's parts are summed instead.)
  return attach_auxiliary_loss(out, cp_ ? balance * static_cast<double>(context_parts) : balance, aux_gradient_factor_);
}

torch::Tensor MoEImpl::route_and_compute(const torch::Tensor& flat, int64_t sequences, int64_t seq, Pass pass,
                                         torch::Tensor& balance) {
  const int64_t k = config_.num_experts_per_tok;
  torch::Tensor logits = torch::nn::functional::linear(flat.to(torch::kFloat32), gate_weight_.to(torch::kFloat32));
  Routing routing = route_tokens(logits, bias_, config_);

  // Every (token, choice) pair, sorted by expert: each expert's tokens are one contiguous batch.
  torch::Tensor expert_of = routing.experts.reshape({-1});
  torch::Tensor order = expert_of.argsort();
  torch::Tensor token_of = order.div(k, "floor");
  // Counted on the device: CUDA's bincount reads the minimum and maximum on the host first.
  torch::Tensor counts = torch::zeros({config_.n_routed_experts}, expert_of.options())
                             .scatter_add_(0, expert_of, torch::ones_like(expert_of));
  const bool first_pass = is_training() && pass == Pass::kFirst;  // a rerun in the backward pass counts nothing again
  if (first_pass) {
    torch::NoGradGuard no_grad;
    load_ += counts.to(load_.scalar_type());
  }
  if (first_pass && shard_.count > 1) count_ranks_reached(routing.experts);
  torch::Tensor inputs = flat.index_select(0, token_of);
  torch::Tensor weights = routing.weights.reshape({-1}).index_select(0, order).to(flat.scalar_type()).unsqueeze(1);
  torch::Tensor routed = torch::zeros_like(flat).index_add(0, token_of, routed_experts(inputs, counts) * weights);
  if (is_training() && config_.aux_loss_alpha > 0) {
    std::function<void(torch::Tensor&)> sum_over_parts;
    if (tp_ || cp_)
      sum_over_parts = [this](torch::Tensor& t) {
        if (tp_) tp_.group->all_reduce_sum(t);
        if (cp_) cp_->all_reduce_sum(t);
      };
    balance = sequence_balance_loss(routing, sequences, config_, sum_over_parts, seq);
    if (first_pass) {
      torch::NoGradGuard no_grad;
      balance_loss_ += balance.detach().to(balance_loss_.scalar_type());
    }
  }
  return routed;
}

torch::Tensor MoEImpl::routed_experts(const torch::Tensor& inputs, const torch::Tensor& counts) {
  const ExchangePlan plan = exchange_->plan(counts, /*measured=*/is_training());
  const torch::Tensor received = exchange_->dispatch(inputs, plan);
  return exchange_->combine(experts_(received, plan.rows_per_expert), plan);
}

// For each token, the distinct ranks its chosen experts live on (sorted, so equal neighbours are
// one rank).
void MoEImpl::count_ranks_reached(const torch::Tensor& chosen) {
  torch::NoGradGuard no_grad;
  const torch::Tensor ranks = std::get<0>(chosen.div(shard_.size(config_.n_routed_experts), "floor").sort(1));
  const torch::Tensor distinct = 1 + (ranks.narrow(1, 1, ranks.size(1) - 1) != ranks.narrow(1, 0, ranks.size(1) - 1)).sum(1);
  ranks_reached_ += distinct.sum().to(ranks_reached_.scalar_type());
  routed_tokens_ += static_cast<double>(chosen.size(0));
}

void MoEImpl::update_bias(const torch::Tensor& load, double gamma, const torch::Tensor& skipped) {
  torch::NoGradGuard no_grad;
  if (bias_.defined()) bias_ += (load.mean() - load).sign().to(bias_.scalar_type()) * ((1 - skipped) * gamma);
  load_.zero_();
  balance_loss_.zero_();
  ranks_reached_.zero_();
  routed_tokens_.zero_();
}

}  // namespace dstrain
