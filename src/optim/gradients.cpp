#include "dstrain/optim/gradients.h"

#include <cmath>

namespace dstrain {

void average_gradients(const NamedTensors& params, Communicator& dp_group) {
  if (dp_group.size() == 1) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& [name, param] : params) {
    if (!param.grad().defined()) param.mutable_grad() = torch::zeros_like(param);
    grads.push_back(param.grad());
  }
  std::vector<torch::Tensor> flat_views;
  for (const torch::Tensor& g : grads) flat_views.push_back(g.reshape({-1}));
  torch::Tensor flat = torch::cat(flat_views);
  dp_group.all_reduce(flat, ReduceOp::kAvg);
  int64_t offset = 0;
  for (torch::Tensor& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

double global_grad_norm(const NamedTensors& params, Communicator* model_group) {
  torch::NoGradGuard no_grad;
  torch::Tensor sum = torch::zeros({1}, torch::kFloat64);
  for (const auto& [name, param] : params)
    if (param.grad().defined()) sum += param.grad().to(torch::kFloat64).pow(2).sum();
  if (model_group && model_group->size() > 1) model_group->all_reduce(sum, ReduceOp::kSum);
  return std::sqrt(sum.item<double>());
}

void clip_gradients(const NamedTensors& params, double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return;
  torch::NoGradGuard no_grad;
  const double scale = max_norm / (norm + 1e-6);
  for (const auto& [name, param] : params)
    if (param.grad().defined()) param.grad().mul_(scale);
}

}  // namespace dstrain
