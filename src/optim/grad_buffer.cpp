#include "dstrain/optim/grad_buffer.h"

namespace dstrain {

GradientBuffer::GradientBuffer(const NamedTensors& params) : params_(params) {
  int64_t total = 0;
  for (const auto& [name, param] : params_) total += param.numel();
  const torch::Device device = params_.empty() ? torch::Device(torch::kCPU) : params_.front().second.device();
  flat_ = torch::zeros({total}, torch::dtype(torch::kFloat32).device(device));
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& param = params_[i].second;
    views_.push_back(flat_.narrow(0, offset, param.numel()).view(param.sizes()));
    offset += param.numel();
    if (param.scalar_type() == torch::kFloat32)
      param.mutable_grad() = views_.back();
    else
      added_in_.push_back(i);
  }
}

void GradientBuffer::zero() {
  first_pass_ = true;
  if (added_in_.empty()) {
    flat_.zero_();
    return;
  }
  // Only what autograd accumulates into; the others are overwritten by the first pass.
  for (size_t i = 0, next = 0; i < views_.size(); ++i) {
    if (next < added_in_.size() && added_in_[next] == i) {
      ++next;
      continue;
    }
    views_[i].zero_();
  }
}

void GradientBuffer::accumulate() {
  torch::NoGradGuard no_grad;
  for (size_t i : added_in_) {
    torch::Tensor& param = params_[i].second;
    if (!param.grad().defined()) {  // unused in this pass
      if (first_pass_) views_[i].zero_();
      continue;
    }
    if (first_pass_)
      views_[i].copy_(param.grad());
    else
      views_[i].add_(param.grad());
    param.mutable_grad() = torch::Tensor();  // the next backward pass hands over a fresh one
  }
  first_pass_ = false;
}

}  // namespace dstrain
