#include "dstrain/model/tensor_parallel_projections.h"

#include <torch/csrc/autograd/custom_function.h>

namespace dstrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward pass needs besides tensors. With a deferral the weights came in detached (no
// autograd edge to their accumulators: that belongs to the W action) and `parameters` are where
// their gradients go.
struct EnteringSpec : torch::CustomClassHolder {
  TensorParallelRegion region;
  WeightGradientDeferral* deferral = nullptr;
  std::vector<torch::Tensor> parameters;
};

class EnteringProjections : public torch::autograd::Function<EnteringProjections> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                               const c10::intrusive_ptr<EnteringSpec>& spec) {
    const TensorParallelRegion& region = spec->region;
    const torch::Tensor entered =
        region.sequence_parallel ? region.group->all_gather(x, TensorParallelRegion::token_dim(x)) : x;
    variable_list outputs, saved = {x};
    for (const torch::Tensor& weight : weights) {
      outputs.push_back(torch::nn::functional::linear(entered, weight));
      saved.push_back(weight);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["spec"] = c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(spec));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const auto spec = c10::static_intrusive_pointer_cast<EnteringSpec>(ctx->saved_data["spec"].toCapsule());
    TensorParallelGroup& group = *spec->region.group;
    const bool sequence_parallel = spec->region.sequence_parallel;
    const int64_t dim = TensorParallelRegion::token_dim(x);
    auto gathering = sequence_parallel ? group.all_gather_async(x, dim) : nullptr;
    torch::Tensor dentered;  // Σ dyᵢ Wᵢ, while the input is gathered again
    if (ctx->needs_input_grad(0))
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!grads[i].defined()) continue;
        const torch::Tensor term = grads[i].matmul(saved[i + 1]);
        dentered = dentered.defined() ? dentered.add_(term) : term;
      }
    const torch::Tensor entered = gathering ? gathering->wait() : x;
    std::unique_ptr<TensorParallelWork> reducing;
    if (dentered.defined())
      reducing = sequence_parallel ? group.reduce_scatter_async(dentered, dim) : group.all_reduce_sum_async(dentered);
    variable_list result = {torch::Tensor()};
    for (size_t i = 0; i < grads.size(); ++i)  // the weights' gradients, while the input's is reduced
      result.push_back(weight_gradient(ctx, *spec, i, grads[i], entered));
    if (reducing) result[0] = reducing->wait();
    result.emplace_back();  // the spec
    return result;
  }

 private:
  // dyᵀ entered (projection_weight_gradient), or handed to the deferral (undefined returned).
  static torch::Tensor weight_gradient(AutogradContext* ctx, const EnteringSpec& spec, size_t i,
                                       const torch::Tensor& grad, const torch::Tensor& entered) {
    if (!grad.defined()) return {};
    auto product = [grad, entered] { return projection_weight_gradient(grad, entered); };
    if (spec.deferral) {
      spec.deferral->defer(spec.parameters[i], product);
      return {};
    }
    return ctx->needs_input_grad(i + 1) ? product() : torch::Tensor();
  }
};

}  // namespace

std::vector<torch::Tensor> project_into_tensor_parallel(const TensorParallelRegion& region, const torch::Tensor& x,
                                                        const std::vector<Projection>& projections) {
  bool fused = region && torch::GradMode::is_enabled();
  for (const Projection& p : projections) fused = fused && !p->computes_in_fp8();
  std::vector<torch::Tensor> outputs;
  if (!fused) {
    const torch::Tensor entered = region.enter(x);
    for (Projection p : projections) outputs.push_back(p(entered));
    return outputs;
  }
  auto spec = c10::make_intrusive<EnteringSpec>();
  spec->region = region;
  spec->deferral = projections.front()->deferral_for(x);
  std::vector<torch::Tensor> weights;
  for (const Projection& p : projections) {
    weights.push_back(spec->deferral ? p->weight.detach() : p->weight);
    if (spec->deferral) spec->parameters.push_back(p->weight);
  }
  return EnteringProjections::apply(x, at::TensorList(weights), spec);
}

}  // namespace dstrain
