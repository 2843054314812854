#include "dstrain/optim/loss_scaler.h"

namespace dstrain {

DynamicLossScaler::DynamicLossScaler(double initial_scale, int64_t growth_interval, const torch::Device& device)
    : growth_interval_(growth_interval) {
  auto f32 = torch::dtype(torch::kFloat32).device(device);
  scale_ = torch::full({}, initial_scale, f32);
  clean_steps_ = torch::zeros({}, f32);
  skipped_ = torch::zeros({}, f32);
}

void DynamicLossScaler::restore(double scale, double clean_steps, double skipped_steps) {
  scale_.fill_(scale);
  clean_steps_.fill_(clean_steps);
  skipped_.fill_(skipped_steps);
}

void DynamicLossScaler::update(const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  torch::Tensor overflow = found_inf.to(torch::kFloat32).gt(0);
  skipped_.add_(overflow.to(torch::kFloat32));
  clean_steps_.copy_(torch::where(overflow, torch::zeros_like(clean_steps_), clean_steps_ + 1));
  torch::Tensor grow = clean_steps_.ge(static_cast<double>(growth_interval_));
  scale_.copy_(torch::where(overflow, scale_ * kBackoffFactor, torch::where(grow, scale_ * kGrowthFactor, scale_)));
  clean_steps_.masked_fill_(grow, 0.0);
}

}  // namespace dstrain
