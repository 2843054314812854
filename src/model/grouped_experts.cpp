#include "dstrain/model/grouped_experts.h"

#include "dstrain/model/fp8_projection.h"
#include "dstrain/model/grouped_projection.h"
#include "dstrain/model/swiglu_activation.h"

namespace dstrain {
namespace {

constexpr const char* kExperts = "mlp.experts.";

}  // namespace

GroupedExpertsImpl::GroupedExpertsImpl(int64_t experts, int64_t first_expert, int64_t hidden, int64_t intermediate,
                                       const ComputeOptions& options)
    : first_(first_expert),
      selective_(options.selective()),
      cuda_kernels_(options.cuda_kernels),
      grouped_(options.grouped_matmul),
      deferral_(options.deferral),
      fp8_(options.fp8),
      fp8_kernel_(options.fp8_matmul),
      fp8_weights_(std::make_unique<Fp8WeightCaches>()),
      fp8_inputs_(std::make_unique<Fp8InputShare>()) {
  gate_proj_ = register_parameter("gate_proj", torch::zeros({experts, intermediate, hidden}));
  up_proj_ = register_parameter("up_proj", torch::zeros({experts, intermediate, hidden}));
  down_proj_ = register_parameter("down_proj", torch::zeros({experts, hidden, intermediate}));
}

int64_t GroupedExpertsImpl::fp8_quantizations() const {
  return fp8_weights_->gate.made() + fp8_weights_->up.made() + fp8_weights_->down.made();
}

torch::Tensor GroupedExpertsImpl::project(const torch::Tensor& rows, const torch::Tensor& weights,
                                          const std::vector<int64_t>& counts, Fp8WeightCache& fp8_weights) {
  if (fp8_ != Fp8Recipe::kNone)
    return fp8_grouped_projection(rows, weights, counts,
                                  {fp8_, &fp8_weights, deferral_, fp8_inputs_.get(), fp8_kernel_.get()});
  return grouped_projection(rows, weights, counts, grouped_.get(), deferral_);
}

torch::Tensor GroupedExpertsImpl::forward(const torch::Tensor& rows, const std::vector<int64_t>& rows_per_expert) {
  const torch::Tensor gate = project(rows, gate_proj_, rows_per_expert, fp8_weights_->gate);
  const torch::Tensor up = project(rows, up_proj_, rows_per_expert, fp8_weights_->up);
  auto down = [this, rows_per_expert](const Tensors& activation) {
    return Tensors{project(activation[0], down_proj_, rows_per_expert, fp8_weights_->down)};
  };
  const bool kernel = cuda_kernels_;
  if (!selective_.on) return down({swiglu_activation(gate, up, kernel)})[0];
  // Selective recomputation: the activation is computed again in the backward pass, not kept.
  return recompute_outputs([kernel](const Tensors& in) { return Tensors{swiglu_activation(in[0], in[1], kernel)}; },
                           {gate, up}, down, selective_.clock)[0];
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
