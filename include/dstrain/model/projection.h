// A linear map without bias, y = x Wᵀ: every projection of DeepSeek's models, its parameter named
// "weight" as in Hugging Face's nn.Linear. It computes what torch::nn::Linear computes; under a
// zero-bubble pipeline schedule (its deferral deferring() when the forward pass runs) its backward
// pass computes the input's gradient at once and leaves the weight's to the schedule's W action,
// with the same products autograd would run. Under FP8 training (a recipe other than none) its
// products are FP8 ones (fp8_projection.h).
#pragma once

#include "dstrain/core/torch_api.h"

#include <memory>

#include "dstrain/model/compute_options.h"
#include "dstrain/model/fp8_input_share.h"
#include "dstrain/model/fp8_matmul.h"
#include "dstrain/model/fp8_recipe.h"
#include "dstrain/model/fp8_weight_cache.h"
#include "dstrain/model/weight_gradient_deferral.h"

namespace dstrain {

class ProjectionImpl : public torch::nn::Module {
 public:
  // `deferral`: where its weight gradient may go (ComputeOptions::deferral); nullptr: never deferred.
  // `fp8`: ComputeOptions::fp8 for the decoder layers' projections; none for those kept in
  // train.precision. `fp8_inputs`: shared by the projections that read the same input.
  // `fp8_kernel`: ComputeOptions::fp8_matmul (nullptr: the products emulated).
  ProjectionImpl(int64_t in_features, int64_t out_features, WeightGradientDeferral* deferral = nullptr,
                 Fp8Recipe fp8 = Fp8Recipe::kNone, std::shared_ptr<Fp8InputShare> fp8_inputs = nullptr,
                 std::shared_ptr<Fp8Matmul> fp8_kernel = nullptr);
  torch::Tensor forward(const torch::Tensor& x);
  // Whether its products are FP8 ones, which only it computes (plain ones others may fuse:
  // tensor_parallel_projections.h).
  bool computes_in_fp8() const { return fp8_ != Fp8Recipe::kNone; }
  // Where the weight's gradient of a product with `x` built now goes: the deferral under a
  // zero-bubble schedule, or nullptr (autograd's, at once).
  WeightGradientDeferral* deferral_for(const torch::Tensor& x) const;

  torch::Tensor weight;  // [out_features, in_features]

 private:
  WeightGradientDeferral* deferral_;
  Fp8Recipe fp8_;
  std::unique_ptr<Fp8WeightCache> fp8_weights_;
  std::shared_ptr<Fp8InputShare> fp8_inputs_;
  std::shared_ptr<Fp8Matmul> fp8_kernel_;
};
TORCH_MODULE(Projection);

// The gradient of y = x Wᵀ's weight, dyᵀ x, with x and dy folded to rows as LibTorch's linear
// backward folds them: what a projection's W action, deferred or not, computes.
torch::Tensor projection_weight_gradient(const torch::Tensor& grad_output, const torch::Tensor& input);

// A decoder layer's projection, deferred and in FP8 as `options` say; `same_input`: shared by the
// projections that read the same input (FP8 keeps one copy of it for them all).
Projection layer_projection(int64_t in_features, int64_t out_features, const ComputeOptions& options,
                            std::shared_ptr<Fp8InputShare> same_input = nullptr);

}  // namespace dstrain
