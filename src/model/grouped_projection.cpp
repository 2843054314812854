#include "dstrain/model/grouped_projection.h"

#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <stdexcept>
#include <string>

#include "dstrain/model/expert_rows.h"

namespace dstrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the autograd function takes besides tensors: the rows of each expert, the grouped product
// (or nullptr), and the parameter whose gradient the W action computes with its deferral
// (undefined when the backward pass computes it at once). Not a tensor argument: that would give
// autograd an edge to its accumulator, which belongs to the W action.
struct ExpertRows {
  std::vector<int64_t> counts;
  GroupedMatmul* grouped = nullptr;
  torch::Tensor deferred_weight;
  WeightGradientDeferral* deferral = nullptr;
};

// [rows of e] = a[rows of e] × stack[e] for each expert e with rows: [N, K] × [experts, K, M] → [N, M].
torch::Tensor per_expert_products(const torch::Tensor& a, const torch::Tensor& stack,
                                  const std::vector<int64_t>& counts, GroupedMatmul* grouped) {
  torch::Tensor out = grouped ? (*grouped)(a, stack, counts) : torch::Tensor();  // one kernel where LibTorch has one
  if (out.defined()) return out;
  out = torch::empty({a.size(0), stack.size(2)}, a.options());
  for_each_expert_with_rows(counts, [&](int64_t e, int64_t start, int64_t n) {
    torch::Tensor part = out.narrow(0, start, n);
    torch::mm_out(part, a.narrow(0, start, n), stack[e]);
  });
  return out;
}

// dW_e = dy_eᵀ x_e for each expert; zero for an expert without rows.
torch::Tensor weight_gradient(const torch::Tensor& rows, const torch::Tensor& grad, const std::vector<int64_t>& counts,
                              torch::IntArrayRef weight_shape, GroupedMatmul* grouped) {
  torch::Tensor result = grouped ? (*grouped)(grad.t(), rows, counts) : torch::Tensor();
  if (result.defined()) return result;
  result = torch::zeros(weight_shape, grad.options());
  for_each_expert_with_rows(counts, [&](int64_t e, int64_t start, int64_t n) {
    torch::Tensor expert = result.select(0, e);
    torch::mm_out(expert, grad.narrow(0, start, n).t(), rows.narrow(0, start, n));
  });
  return result;
}

class GroupedProjection : public torch::autograd::Function<GroupedProjection> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& rows, const torch::Tensor& weights,
                               const ExpertRows& experts) {
    ctx->save_for_backward({rows, weights});
    ctx->saved_data["counts"] = experts.counts;
    ctx->saved_data["grouped"] = reinterpret_cast<int64_t>(experts.grouped);
    if (experts.deferred_weight.defined()) {
      ctx->saved_data["deferred_weight"] = experts.deferred_weight;
      ctx->saved_data["deferral"] = reinterpret_cast<int64_t>(experts.deferral);
    }
    return per_expert_products(rows, weights.transpose(1, 2), experts.counts, experts.grouped);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &rows = saved[0], &weights = saved[1];
    const torch::Tensor grad = grad_outputs[0].contiguous();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    auto* grouped = reinterpret_cast<GroupedMatmul*>(ctx->saved_data["grouped"].toInt());
    torch::Tensor grad_rows, grad_weights;
    if (ctx->needs_input_grad(0)) grad_rows = per_expert_products(grad, weights, counts, grouped);
    const auto deferred = ctx->saved_data.find("deferred_weight");
    if (deferred != ctx->saved_data.end()) {
      const std::vector<int64_t> shape = weights.sizes().vec();
      auto* deferral = reinterpret_cast<WeightGradientDeferral*>(ctx->saved_data["deferral"].toInt());
      deferral->defer(deferred->second.toTensor(), [rows, grad, counts, shape, grouped] {
        return weight_gradient(rows, grad, counts, shape, grouped);
      });
    } else if (ctx->needs_input_grad(1)) {
      grad_weights = weight_gradient(rows, grad, counts, weights.sizes(), grouped);
    }
    return {grad_rows, grad_weights, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor grouped_projection(const torch::Tensor& rows, const torch::Tensor& weights,
                                 const std::vector<int64_t>& rows_per_expert, GroupedMatmul* grouped,
                                 WeightGradientDeferral* deferral) {
  const int64_t total = std::accumulate(rows_per_expert.begin(), rows_per_expert.end(), int64_t{0});
  if (weights.dim() != 3 || static_cast<int64_t>(rows_per_expert.size()) != weights.size(0) ||
      total != rows.size(0) || rows.size(1) != weights.size(2))
    throw std::invalid_argument("grouped_projection: " + std::to_string(rows.size(0)) + " rows for counts summing to " +
                                std::to_string(total) + ", over weights of " + std::to_string(weights.dim()) +
                                " dimensions for " + std::to_string(rows_per_expert.size()) + " experts");
  // (Only where rows carry a graph: otherwise the backward pass, and the weights' gradient with
  // it, would never run.)
  if (deferral && deferral->deferring() && torch::GradMode::is_enabled() && weights.requires_grad() &&
      rows.requires_grad())
    return GroupedProjection::apply(rows, weights.detach(), ExpertRows{rows_per_expert, grouped, weights, deferral});
  return GroupedProjection::apply(rows, weights, ExpertRows{rows_per_expert, grouped, torch::Tensor(), nullptr});
}

}  // namespace dstrain
