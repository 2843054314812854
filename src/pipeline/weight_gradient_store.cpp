#include "dstrain/pipeline/weight_gradient_store.h"

#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include "dstrain/core/error.h"

namespace dstrain {

void WeightGradientStore::defer(const torch::Tensor& weight, std::function<torch::Tensor()> gradient) {
  std::lock_guard<std::mutex> lock(collecting_mutex_);
  if (collecting_ == nullptr)
    throw Error(ExitCode::kInternal, "a deferred weight gradient outside the B action of a zero-bubble schedule");
  collecting_->push_back({weight, std::move(gradient)});
}

void WeightGradientStore::collect(const Key& key, const std::function<void()>& backward) {
  std::vector<Work> work;
  {
    std::lock_guard<std::mutex> lock(collecting_mutex_);
    collecting_ = &work;
  }
  try {
    backward();
  } catch (...) {
    std::lock_guard<std::mutex> lock(collecting_mutex_);
    collecting_ = nullptr;
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(collecting_mutex_);
    collecting_ = nullptr;
  }
  std::vector<Work>& kept = pending_[key];
  for (Work& done : work) kept.push_back(std::move(done));
}

void WeightGradientStore::compute(const Key& key) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return;  // the B action deferred nothing (a chunk without products)
  std::vector<Work> work = std::move(it->second);
  pending_.erase(it);
  // A weight used twice gets the sum of its products, in the order the backward pass left them,
  // and reaches its accumulator once, as autograd's input buffer would have it: each weight's
  // place in order of first use, and its last use, after which its gradient is complete.
  std::vector<torch::Tensor> weights;
  std::vector<size_t> place(work.size()), last_use;
  for (size_t i = 0; i < work.size(); ++i) {
    auto same = std::find_if(weights.begin(), weights.end(), [&](const torch::Tensor& t) { return t.is_same(work[i].weight); });
    place[i] = static_cast<size_t>(same - weights.begin());
    if (same == weights.end()) {
      weights.push_back(work[i].weight);
      last_use.push_back(i);
    }
    last_use[place[i]] = i;
  }
  // To the accumulators in that order, in batches of about kBatchBytes, each computed just before
  // it goes: one call of the autograd engine costs tens of microseconds and a chunk has dozens of
  // projections, but the whole chunk's gradients at once would hold a copy of its weights.
  constexpr int64_t kBatchBytes = int64_t{32} << 20;
  std::vector<torch::Tensor> gradients(weights.size());
  size_t sent = 0;  // weights [0, sent) have reached their accumulators
  int64_t held = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    torch::Tensor& sum = gradients[place[i]];
    {
      torch::NoGradGuard no_grad;
      torch::Tensor gradient = work[i].gradient();
      work[i].gradient = nullptr;  // its saved inputs are given back as soon as they are used
      if (sum.defined()) {
        sum = sum + gradient;
      } else {
        sum = std::move(gradient);
        held += sum.nbytes();
      }
    }
    if (held < kBatchBytes && i + 1 < work.size()) continue;
    size_t complete = sent;
    while (complete < weights.size() && last_use[complete] <= i) ++complete;
    if (complete == sent) continue;
    torch::autograd::backward(std::vector<torch::Tensor>(weights.begin() + sent, weights.begin() + complete),
                              std::vector<torch::Tensor>(gradients.begin() + sent, gradients.begin() + complete));
    for (; sent < complete; ++sent) {
      held -= gradients[sent].nbytes();
      gradients[sent] = torch::Tensor();
    }
  }
}

}  // namespace dstrain
