// A linear map without bias, y = x Wᵀ: every projection of DeepSeek's models, its parameter named
// "weight" as in Hugging Face's nn.Linear. It computes what torch::nn::Linear computes; under a
// zero-bubble pipeline schedule (its deferral deferring() when the forward pass runs) its backward
// pass computes the input's gradient at once and leaves the weight's to the schedule's W action,
// with the same products autograd would run.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/model/weight_gradient_deferral.h"

namespace dstrain {

class ProjectionImpl : public torch::nn::Module {
 public:
  // `deferral`: where its weight gradient may go (ComputeOptions::deferral); nullptr: never deferred.
  ProjectionImpl(int64_t in_features, int64_t out_features, WeightGradientDeferral* deferral = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // [out_features, in_features]

 private:
  WeightGradientDeferral* deferral_;
};
TORCH_MODULE(Projection);

}  // namespace dstrain
