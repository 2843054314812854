// The routed experts a MoE layer holds, each a SwiGLU MLP, down(silu(gate(x)) × up(x)), with
// their weights stacked: one parameter per projection over the experts, so that their matrix
// products run as one grouped product (grouped_projection.h) and the optimizer and gradient
// buckets see three tensors a layer instead of three per expert.
//
//   gate_proj, up_proj   [experts, moe_intermediate_size, hidden_size]
//   down_proj            [experts, hidden_size, moe_intermediate_size]
//
// That is the module's layout. Checkpoints, Hugging Face import and export, evaluation and
// generation keep Hugging Face's names, a tensor per expert numbered over the whole layer
// ("<i>.gate_proj.weight" under the layer's "mlp.experts"): expert_weights() gives each as a view
// of the stack, so that writing the view writes the parameter. A layer holding part of its
// experts (expert parallelism) numbers them from its first.
#pragma once

#include "dstrain/core/torch_api.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/compute_options.h"
#include "dstrain/model/fp8_input_share.h"
#include "dstrain/model/fp8_matmul.h"
#include "dstrain/model/fp8_weight_cache.h"
#include "dstrain/model/grouped_matmul.h"

namespace dstrain {

class GroupedExpertsImpl : public torch::nn::Module {
 public:
  GroupedExpertsImpl(int64_t experts, int64_t first_expert, int64_t hidden, int64_t intermediate,
                     const ComputeOptions& options = {});
  // rows [N, hidden], sorted by expert: rows_per_expert[e] rows for the e-th expert held.
  torch::Tensor forward(const torch::Tensor& rows, const std::vector<int64_t>& rows_per_expert);

  // Each expert's weights under their Hugging Face names relative to this module, views of the
  // stacked parameters, in expert order.
  std::vector<std::pair<std::string, torch::Tensor>> expert_weights() const;
  int64_t first_expert() const { return first_; }
  // The experts' weights quantized for FP8 products so far (tests: once a step, not per micro-batch).
  int64_t fp8_quantizations() const;

 private:
  // A cache for each stack: one cache serves one weight (fp8_weight_cache.h).
  struct Fp8WeightCaches {
    Fp8WeightCache gate, up, down;
  };

  torch::Tensor project(const torch::Tensor& rows, const torch::Tensor& weights, const std::vector<int64_t>& counts,
                        Fp8WeightCache& fp8_weights);

  int64_t first_;
  SelectiveRecompute selective_;
  bool cuda_kernels_;
  std::shared_ptr<GroupedMatmul> grouped_;
  WeightGradientDeferral* deferral_;
  Fp8Recipe fp8_;
  std::shared_ptr<Fp8Matmul> fp8_kernel_;
  std::unique_ptr<Fp8WeightCaches> fp8_weights_;
  std::unique_ptr<Fp8InputShare> fp8_inputs_;  // gate and up read the same rows
  torch::Tensor gate_proj_, up_proj_, down_proj_;
};
TORCH_MODULE(GroupedExperts);

// Whether `name` (a global one) is a stacked parameter of routed experts,
// "...mlp.experts.gate_proj", rather than one expert's "...mlp.experts.<i>.gate_proj.weight".
bool is_stacked_expert_parameter(const std::string& name);
// The Hugging Face name of expert `expert`'s part of the stacked parameter `stacked_name`:
// "P.experts.gate_proj" → "P.experts.<expert>.gate_proj.weight".
std::string expert_weight_name(const std::string& stacked_name, int64_t expert);

}  // namespace dstrain
