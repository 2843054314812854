#include "dstrain/optim/adamw.h"

#include <cmath>

#include "dstrain/core/profile_scope.h"
#include "dstrain/core/torch_compat.h"

namespace dstrain {

namespace {

std::vector<ParameterShard> whole_parameters(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  std::vector<ParameterShard> shards;
  for (const auto& [name, param] : params) shards.push_back({name, param, torch::Tensor(), param.sizes().vec(), 0});
  return shards;
}

}  // namespace

AdamW::AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, const AdamWOptions& options)
    : AdamW(whole_parameters(params), options) {}

AdamW::AdamW(const std::vector<ParameterShard>& shards, const AdamWOptions& options) : options_(options) {
  torch::NoGradGuard no_grad;
  for (const ParameterShard& shard : shards) {
    const torch::Tensor& param = shard.values;
    torch::Tensor master =
        param.scalar_type() == torch::kFloat32 ? param : param.detach().to(torch::kFloat32).clone();
    // Matrices decay, whatever piece of them this rank holds.
    states_.push_back({shard.name, param, master, torch::zeros_like(master), torch::zeros_like(master),
                       /*decay=*/shard.full_shape.size() >= 2, shard.full_shape, shard.offset});
  }
  fused_ = !states_.empty() && compat::has_fused_adamw(states_.front().param.device());
  if (fused_) step_ = torch::zeros({}, torch::dtype(torch::kFloat32).device(states_.front().param.device()));
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const State& s : states_)
    bytes += s.exp_avg.nbytes() + s.exp_avg_sq.nbytes() + (s.master.is_same(s.param) ? 0 : s.master.nbytes());
  return bytes;
}

int64_t AdamW::step_count() const { return fused_ ? static_cast<int64_t>(step_.item<float>()) : step_count_; }

void AdamW::set_step_count(int64_t count) {
  step_count_ = count;
  if (fused_) step_.fill_(static_cast<double>(count));
}

void AdamW::load_masters() {
  torch::NoGradGuard no_grad;
  for (State& s : states_)
    if (!s.master.is_same(s.param)) s.param.copy_(s.master);
}

void AdamW::step(double lr, const std::vector<torch::Tensor>& grads, const torch::Tensor& found_inf,
                 const torch::Tensor& grad_divisor) {
  ProfileScope scope(profile_part::kOptimizer);
  torch::NoGradGuard no_grad;
  if (fused_) {
    fused_step(lr, grads, found_inf, grad_divisor);
  } else {
    // Reading the flag and the divisor costs nothing on the CPU, where this path runs.
    if (found_inf.item<float>() != 0.0f) return;
    explicit_step(lr, grads, grad_divisor.defined() ? grad_divisor.item<double>() : 1.0);
  }
  std::vector<torch::Tensor> rounded, masters;  // bf16/fp16 parameters and their fp32 masters
  for (State& s : states_) {
    if (s.master.is_same(s.param)) continue;
    rounded.push_back(s.param);
    masters.push_back(s.master);
  }
  if (!rounded.empty()) compat::copy_all(rounded, masters);
}

void AdamW::explicit_step(double lr, const std::vector<torch::Tensor>& grads, double grad_divisor) {
  ++step_count_;
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_count_));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_count_));
  for (size_t i = 0; i < states_.size(); ++i) {
    State& s = states_[i];
    const torch::Tensor& grad = grads[i];
    if (s.decay && options_.weight_decay > 0) s.master.mul_(1.0 - lr * options_.weight_decay);
    // The divisor goes into the moments' coefficients: no divided copy of the gradient.
    s.exp_avg.mul_(options_.beta1).add_(grad, (1.0 - options_.beta1) / grad_divisor);
    s.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, (1.0 - options_.beta2) / (grad_divisor * grad_divisor));
    // One temporary the size of the parameter, divided and shifted in place.
    torch::Tensor denom = s.exp_avg_sq.sqrt().div_(std::sqrt(bias2)).add_(options_.eps);
    s.master.addcdiv_(s.exp_avg, denom, -lr / bias1);
  }
}

void AdamW::fused_step(double lr, const std::vector<torch::Tensor>& grads, const torch::Tensor& found_inf,
                       const torch::Tensor& grad_divisor) {
  // The step number advances only for an update that happens (the kernel skips on found_inf).
  step_.add_(1.0 - found_inf);
  // Two calls: with and without weight decay. The kernel reads one step tensor per parameter;
  // they all share this one.
  for (bool decay : {true, false}) {
    std::vector<torch::Tensor> masters, group_grads, exp_avgs, exp_avg_sqs;
    for (size_t i = 0; i < states_.size(); ++i) {
      if (states_[i].decay != decay) continue;
      masters.push_back(states_[i].master);
      group_grads.push_back(grads[i]);
      exp_avgs.push_back(states_[i].exp_avg);
      exp_avg_sqs.push_back(states_[i].exp_avg_sq);
    }
    if (masters.empty()) continue;
    std::vector<torch::Tensor> steps(masters.size(), step_);
    compat::fused_adamw(masters, group_grads, exp_avgs, exp_avg_sqs, steps, lr, options_.beta1, options_.beta2,
                        decay ? options_.weight_decay : 0.0, options_.eps, grad_divisor, found_inf);
  }
}

}  // namespace dstrain
