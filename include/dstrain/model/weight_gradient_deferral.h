// Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism") split a stage's
// backward pass in two: B, the gradient of the stage's input, which the previous stage waits for,
// and W, the gradients of the weights, which the schedule runs later to fill time the stage would
// otherwise wait. The model's matrix products (projection.h, grouped_projection.h) take part
// through this interface: built while deferring() holds, a product's backward pass computes its
// input's gradient at once and hands defer() the work that computes its weight's. The pipeline
// implements it (pipeline/weight_gradient_store.h) and runs the work in its W actions.
#pragma once

#include "dstrain/core/torch_api.h"

#include <functional>

namespace dstrain {

class WeightGradientDeferral {
 public:
  virtual ~WeightGradientDeferral() = default;
  // Forward side: whether a product built now leaves its weight's gradient for later. (The
  // backward pass may run on another thread than the forward: this is asked when the graph is built.)
  virtual bool deferring() const = 0;
  // Backward side, from inside an autograd function: `gradient` computes `weight`'s gradient from
  // what it captured; it is kept for the W action of the B action under way.
  virtual void defer(const torch::Tensor& weight, std::function<torch::Tensor()> gradient) = 0;
};

}  // namespace dstrain
