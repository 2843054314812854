// Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism") split a stage's
// backward pass in two: B, the gradient of the stage's input, which the previous stage waits for,
// and W, the gradients of the weights, which the schedule runs later to fill time the stage would
// otherwise wait. A matrix product's backward computes its input's gradient at once and, while
// deferral is on, leaves here what its weight's gradient needs (ZB's weight-gradient store,
// Megatron-Core's delayed weight-gradient computation); the W action computes those products.
//
// Deferral is decided when the forward pass builds the graph (deferring()); the work is kept per
// backward pass, under the key the executor gives the B action that ran it.
#pragma once

#include "dstrain/core/torch_api.h"

#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace dstrain {

class WeightGradientStore {
 public:
  using Key = std::pair<int, int>;  // (micro-batch, model chunk)

  // Forward side: whether matrix products built now defer their weight gradients. Off unless a
  // Deferral lives (process-wide: the backward pass may run on another thread than the forward).
  static bool deferring();
  class Deferral {
   public:
    Deferral();
    ~Deferral();
    Deferral(const Deferral&) = delete;
    Deferral& operator=(const Deferral&) = delete;
  };

  // Backward side, from inside an autograd function: the gradient of `weight` that `gradient`
  // computes, kept for the W action of the B action under way. Throws Error(kInternal) outside one.
  static void defer(const torch::Tensor& weight, std::function<torch::Tensor()> gradient);

  // B: runs `backward`, keeping under `key` the weight gradients it defers.
  void collect(const Key& key, const std::function<void()>& backward);
  // W: computes the gradients kept under `key`, in the order the backward pass left them, and
  // accumulates each into its weight through autograd, so that gradient hooks (the data-parallel
  // buckets) see it as they see any other.
  void compute(const Key& key);
  bool empty() const { return pending_.empty(); }

 private:
  struct Work {
    torch::Tensor weight;
    std::function<torch::Tensor()> gradient;
  };
  std::map<Key, std::vector<Work>> pending_;
};

}  // namespace dstrain
