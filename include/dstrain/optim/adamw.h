// AdamW (Loshchilov & Hutter) with decoupled weight decay, as torch.optim.AdamW computes it.
// Weight decay applies to matrices only (embeddings, projections), never to norm weights.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

namespace dstrain {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, const AdamWOptions& options);

  // One update with learning rate `lr` from each parameter's .grad().
  void step(double lr);
  int64_t step_count() const { return step_count_; }

  struct State {
    std::string name;
    torch::Tensor param, exp_avg, exp_avg_sq;
    bool decay;
  };
  const std::vector<State>& states() const { return states_; }

 private:
  AdamWOptions options_;
  std::vector<State> states_;
  int64_t step_count_ = 0;
};

}  // namespace dstrain
