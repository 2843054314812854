// The linear maps of decoder layers under FP8 training (train.fp8 ≠ none, fp8_recipe.h): what
// Projection and the routed experts' grouped_projection compute then. Forward, input gradient and
// weight gradient are the FP8 products of fp8_products.h; the input is kept for the backward pass
// as E4M3 codes with its scales, a byte an element; the weights' quantizations come from the
// module's Fp8WeightCache, the input's from an Fp8InputShare where projections read the same one;
// the products run on LibTorch's FP8 kernel where one is given and applies.
// Outputs and input gradients come in the input's dtype, weight gradients
// in the weight's. Under a zero-bubble schedule (`deferral` deferring() when the forward pass
// runs) the weight gradient is left to the schedule's W action, as without FP8.
#pragma once

#include "dstrain/core/torch_api.h"

#include <vector>

#include "dstrain/model/fp8_input_share.h"
#include "dstrain/model/fp8_matmul.h"
#include "dstrain/model/fp8_recipe.h"
#include "dstrain/model/fp8_weight_cache.h"
#include "dstrain/model/weight_gradient_deferral.h"

namespace dstrain {

struct Fp8Products {
  Fp8Recipe recipe = Fp8Recipe::kNone;
  Fp8WeightCache* weights = nullptr;         // the module's; outlives the backward pass
  WeightGradientDeferral* deferral = nullptr;  // may be nullptr
  Fp8InputShare* inputs = nullptr;             // shared with the projections that read the same input; may be nullptr
  Fp8Matmul* kernel = nullptr;                 // LibTorch's FP8 product (fp8_matmul.h); nullptr: emulated
};

// y = x Wᵀ: x [..., in], weight [out, in] → [..., out].
torch::Tensor fp8_projection(const torch::Tensor& x, const torch::Tensor& weight, const Fp8Products& products);

// The routed experts' products (grouped_projection.h's contract): rows [N, in] sorted by expert,
// weights [experts, out, in] → [N, out]. Each expert's product is quantized on its own, as a kernel
// per expert (or a grouped kernel) sees it. Where the kernel's grouped product computes the forward
// product and the input gradient (Fp8Matmul::groups), which takes a scale a row at most, blockwise
// experts take rowwise scales; their weight gradients run an expert at a time.
torch::Tensor fp8_grouped_projection(const torch::Tensor& rows, const torch::Tensor& weights,
                                     const std::vector<int64_t>& rows_per_expert, const Fp8Products& products);

}  // namespace dstrain
