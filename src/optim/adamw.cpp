#include "dstrain/optim/adamw.h"

#include <cmath>

namespace dstrain {

AdamW::AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, const AdamWOptions& options)
    : options_(options) {
  for (auto& [name, param] : params) {
    states_.push_back({name, param, torch::zeros_like(param, torch::kFloat32),
                       torch::zeros_like(param, torch::kFloat32), /*decay=*/param.dim() >= 2});
  }
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_count_;
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_count_));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_count_));
  for (State& s : states_) {
    torch::Tensor grad = s.param.grad();
    if (!grad.defined()) continue;
    if (s.decay && options_.weight_decay > 0) s.param.mul_(1.0 - lr * options_.weight_decay);
    s.exp_avg.mul_(options_.beta1).add_(grad, 1.0 - options_.beta1);
    s.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    torch::Tensor denom = (s.exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(options_.eps);
    s.param.addcdiv_(s.exp_avg, denom, -lr / bias1);
  }
}

}  // namespace dstrain
