#include "dstrain/core/weight_gradient_store.h"

#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

std::atomic<int> deferrals{0};
// The collection under way: the backward pass that fills it may run on the autograd engine's
// device thread while the thread that started it waits.
std::mutex collecting_mutex;
std::vector<std::pair<torch::Tensor, std::function<torch::Tensor()>>>* collecting = nullptr;

}  // namespace

bool WeightGradientStore::deferring() { return deferrals.load() > 0; }

WeightGradientStore::Deferral::Deferral() { ++deferrals; }
WeightGradientStore::Deferral::~Deferral() { --deferrals; }

void WeightGradientStore::defer(const torch::Tensor& weight, std::function<torch::Tensor()> gradient) {
  std::lock_guard<std::mutex> lock(collecting_mutex);
  if (collecting == nullptr)
    throw Error(ExitCode::kInternal, "a deferred weight gradient outside the B action of a zero-bubble schedule");
  collecting->emplace_back(weight, std::move(gradient));
}

void WeightGradientStore::collect(const Key& key, const std::function<void()>& backward) {
  std::vector<std::pair<torch::Tensor, std::function<torch::Tensor()>>> work;
  {
    std::lock_guard<std::mutex> lock(collecting_mutex);
    collecting = &work;
  }
  try {
    backward();
  } catch (...) {
    std::lock_guard<std::mutex> lock(collecting_mutex);
    collecting = nullptr;
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(collecting_mutex);
    collecting = nullptr;
  }
  std::vector<Work>& kept = pending_[key];
  for (auto& [weight, gradient] : work) kept.push_back({weight, std::move(gradient)});
}

void WeightGradientStore::compute(const Key& key) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return;  // the B action deferred nothing (a chunk without products)
  std::vector<Work> work = std::move(it->second);
  pending_.erase(it);
  // A weight used twice gets the sum of its products, in the order the backward pass left them,
  // and reaches its accumulator once, as autograd's input buffer would have it.
  std::vector<torch::Tensor> weights, gradients;
  {
    torch::NoGradGuard no_grad;
    for (Work& w : work) {
      torch::Tensor gradient = w.gradient();
      w.gradient = nullptr;  // its saved inputs are given back as soon as they are used
      auto same = std::find_if(weights.begin(), weights.end(), [&](const torch::Tensor& t) { return t.is_same(w.weight); });
      if (same == weights.end()) {
        weights.push_back(w.weight);
        gradients.push_back(std::move(gradient));
      } else {
        torch::Tensor& sum = gradients[same - weights.begin()];
        sum = sum + gradient;
      }
    }
  }
  // To the accumulators in the backward pass's order, in batches of about kBatchBytes: one call of
  // the autograd engine costs tens of microseconds, and a chunk has dozens of projections, but
  // the whole chunk's gradients at once would hold a copy of its weights.
  constexpr int64_t kBatchBytes = int64_t{32} << 20;
  size_t first = 0;
  int64_t bytes = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    bytes += gradients[i].nbytes();
    if (bytes < kBatchBytes && i + 1 < weights.size()) continue;
    torch::autograd::backward(std::vector<torch::Tensor>(weights.begin() + first, weights.begin() + i + 1),
                              std::vector<torch::Tensor>(gradients.begin() + first, gradients.begin() + i + 1));
    for (size_t j = first; j <= i; ++j) gradients[j] = torch::Tensor();
    first = i + 1;
    bytes = 0;
  }
}

}  // namespace dstrain
