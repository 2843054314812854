#include "dstrain/model/grouped_experts.h"

#include "dstrain/model/grouped_projection.h"
#include "dstrain/model/recompute.h"
#include "dstrain/model/swiglu_activation.h"

namespace dstrain {
namespace {

constexpr const char* kExperts = "mlp.experts.";

}  // namespace

GroupedExpertsImpl::GroupedExpertsImpl(int64_t experts, int64_t first_expert, int64_t hidden, int64_t intermediate)
    : first_(first_expert) {
  gate_proj_ = register_parameter("gate_proj", torch::zeros({experts, intermediate, hidden}));
  up_proj_ = register_parameter("up_proj", torch::zeros({experts, intermediate, hidden}));
  down_proj_ = register_parameter("down_proj", torch::zeros({experts, hidden, intermediate}));
}

torch::Tensor GroupedExpertsImpl::forward(const torch::Tensor& rows, const std::vector<int64_t>& rows_per_expert) {
  const torch::Tensor gate = grouped_projection(rows, gate_proj_, rows_per_expert);
  const torch::Tensor up = grouped_projection(rows, up_proj_, rows_per_expert);
  auto down = [this, rows_per_expert](const Tensors& activation) {
    return Tensors{grouped_projection(activation[0], down_proj_, rows_per_expert)};
  };
  if (!selective_recompute()) return down({swiglu_activation(gate, up)})[0];
  // Selective recomputation: the activation is computed again in the backward pass, not kept.
  return recompute_outputs([](const Tensors& in) { return Tensors{swiglu_activation(in[0], in[1])}; }, {gate, up},
                           down)[0];
}

std::vector<std::pair<std::string, torch::Tensor>> GroupedExpertsImpl::expert_weights() const {
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  for (const auto& stacked : named_parameters(/*recurse=*/false))
    for (int64_t e = 0; e < stacked.value().size(0); ++e)
      weights.emplace_back(expert_weight_name(stacked.key(), first_ + e), stacked.value()[e]);
  return weights;
}

bool is_stacked_expert_parameter(const std::string& name) {
  const size_t at = name.find(kExperts);
  return at != std::string::npos && name.find('.', at + std::string(kExperts).size()) == std::string::npos;
}

std::string expert_weight_name(const std::string& stacked_name, int64_t expert) {
  const size_t dot = stacked_name.rfind('.');
  const std::string prefix = dot == std::string::npos ? "" : stacked_name.substr(0, dot + 1);
  const std::string projection = dot == std::string::npos ? stacked_name : stacked_name.substr(dot + 1);
  return prefix + std::to_string(expert) + "." + projection + ".weight";
}

}  // namespace dstrain
