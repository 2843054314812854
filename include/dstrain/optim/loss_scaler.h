// Dynamic loss scaling for fp16 training, as torch.cuda.amp.GradScaler does it: the loss is
// multiplied by the scale before the backward pass so that small gradients survive fp16, the
// gradients are divided by it again, and a step whose gradients overflow is skipped and halves
// the scale; after `growth_interval` clean steps in a row the scale doubles. The scale lives on
// the device and is updated there: no host synchronisation.
#pragma once

#include "dstrain/core/torch_api.h"

namespace dstrain {

class DynamicLossScaler {
 public:
  DynamicLossScaler(double initial_scale, int64_t growth_interval, const torch::Device& device);

  const torch::Tensor& scale() const { return scale_; }  // 0-dim fp32
  // After the step whose gradients `found_inf` (0-dim, non-zero: overflow) describes.
  void update(const torch::Tensor& found_inf);
  // Steps skipped so far, as a 0-dim tensor (read it when logging).
  const torch::Tensor& skipped_steps() const { return skipped_; }
  double clean_steps() const { return clean_steps_.item<double>(); }
  // A resumed run continues with a checkpoint's state.
  void restore(double scale, double clean_steps, double skipped_steps);

  static constexpr double kGrowthFactor = 2.0, kBackoffFactor = 0.5;

 private:
  torch::Tensor scale_, clean_steps_, skipped_;
  int64_t growth_interval_;
};

}  // namespace dstrain
