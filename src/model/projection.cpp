#include "dstrain/model/projection.h"

#include <torch/csrc/autograd/custom_function.h>

#include "dstrain/model/fp8_projection.h"

namespace dstrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The parameter the W action accumulates into. Not a tensor argument of the autograd function,
// which would give autograd an edge to its accumulator: that edge belongs to the W action.
struct DeferredWeight {
  torch::Tensor parameter;
  WeightGradientDeferral* deferral;
};

// x Wᵀ whose weight gradient goes to a WeightGradientDeferral; the products are those of
// LibTorch's own linear backward (the input folded to rows): dx = dy W, dW = dyᵀ x.
class DeferredWeightProjection : public torch::autograd::Function<DeferredWeightProjection> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight_values,
                               const DeferredWeight& weight) {
    ctx->save_for_backward({x, weight_values});
    ctx->saved_data["weight"] = weight.parameter;
    ctx->saved_data["deferral"] = reinterpret_cast<int64_t>(weight.deferral);
    return torch::nn::functional::linear(x, weight_values);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight_values = saved[1];
    const torch::Tensor grad = grad_outputs[0];
    const torch::Tensor weight = ctx->saved_data["weight"].toTensor();
    auto* deferral = reinterpret_cast<WeightGradientDeferral*>(ctx->saved_data["deferral"].toInt());
    deferral->defer(weight, [x, grad] { return projection_weight_gradient(grad, x); });
    torch::Tensor grad_x = ctx->needs_input_grad(0) ? grad.matmul(weight_values) : torch::Tensor();
    return {grad_x, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor projection_weight_gradient(const torch::Tensor& grad_output, const torch::Tensor& input) {
  return grad_output.reshape({-1, grad_output.size(-1)}).t().mm(input.reshape({-1, input.size(-1)}));
}

ProjectionImpl::ProjectionImpl(int64_t in_features, int64_t out_features, WeightGradientDeferral* deferral,
                               Fp8Recipe fp8, std::shared_ptr<Fp8InputShare> fp8_inputs,
                               std::shared_ptr<Fp8Matmul> fp8_kernel)
    : deferral_(deferral),
      fp8_(fp8),
      fp8_weights_(std::make_unique<Fp8WeightCache>()),
      fp8_inputs_(std::move(fp8_inputs)),
      fp8_kernel_(std::move(fp8_kernel)) {
  weight = register_parameter("weight", torch::zeros({out_features, in_features}));
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) {
  if (fp8_ != Fp8Recipe::kNone)
    return fp8_projection(x, weight, {fp8_, fp8_weights_.get(), deferral_, fp8_inputs_.get(), fp8_kernel_.get()});
  if (WeightGradientDeferral* deferral = deferral_for(x))
    return DeferredWeightProjection::apply(x, weight.detach(), DeferredWeight{weight, deferral});
  return torch::nn::functional::linear(x, weight);
}

WeightGradientDeferral* ProjectionImpl::deferral_for(const torch::Tensor& x) const {
  // (Only where x carries a graph: otherwise the function's backward, and with it the weight's
  // gradient, would never run.)
  const bool deferred = deferral_ && deferral_->deferring() && torch::GradMode::is_enabled() &&
                        weight.requires_grad() && x.requires_grad();
  return deferred ? deferral_ : nullptr;
}

Projection layer_projection(int64_t in_features, int64_t out_features, const ComputeOptions& options,
                            std::shared_ptr<Fp8InputShare> same_input) {
  return Projection(in_features, out_features, options.deferral, options.fp8, std::move(same_input),
                    options.fp8_matmul);
}

}  // namespace dstrain
