// Zero-bubble pipeline schedules split a stage's backward pass in two (model/weight_gradient_deferral.h):
// B, the gradient of the stage's input, and W, later, the gradients of the weights. This is where
// the model's products leave W's work (ZB's weight-gradient store, Megatron-Core's delayed
// weight-gradient computation): while a Deferral lives the products built defer their weight
// gradients, the work of each B action is kept under the key the executor gives it, and the W
// action computes it.
#pragma once

#include "dstrain/core/torch_api.h"

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "dstrain/model/weight_gradient_deferral.h"

namespace dstrain {

class WeightGradientStore : public WeightGradientDeferral {
 public:
  using Key = std::pair<int, int>;  // (micro-batch, model chunk)

  // Forward side: products built while one lives defer their weight gradients (the training
  // passes of a zero-bubble schedule). Deferrals may nest.
  class Deferral {
   public:
    explicit Deferral(WeightGradientStore& store) : store_(store) { ++store_.deferrals_; }
    ~Deferral() { --store_.deferrals_; }
    Deferral(const Deferral&) = delete;
    Deferral& operator=(const Deferral&) = delete;

   private:
    WeightGradientStore& store_;
  };
  bool deferring() const override { return deferrals_.load() > 0; }

  // Backward side, from inside an autograd function (the backward pass may run on the autograd
  // engine's device thread while the thread that started it waits): kept for the B action under
  // way. Throws Error(kInternal) outside one.
  void defer(const torch::Tensor& weight, std::function<torch::Tensor()> gradient) override;

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
  std::atomic<int> deferrals_{0};
  std::mutex collecting_mutex_;
  std::vector<Work>* collecting_ = nullptr;  // the B action's, while it runs
  std::map<Key, std::vector<Work>> pending_;
};

}  // namespace dstrain
