// DeepSeekMoE (DeepSeek-V2 §2.2, V3 §2.1.2), with Hugging Face's names: mlp.gate (the router,
// and in V3 its balancing bias e_score_correction_bias), mlp.experts.<i>.{gate,up,down}_proj,
// mlp.shared_experts.{gate,up,down}_proj. The routed experts' weights are stacked in the module
// (mlp.experts.{gate,up,down}_proj, grouped_experts.h) and named per expert in checkpoints.
//
//   scores   softmax (V2) or sigmoid (V3) of the router's logits, in fp32
//   choice   top num_experts_per_tok experts by score (+ the bias, V3's noaux_tc, which steers
//            the choice only), within the topk_group best of n_group groups: a group ranks by its
//            best score (V2's group_limited_greedy) or its two best (V3's noaux_tc)
//   weights  the chosen experts' scores (without bias), renormalised to sum 1 with
//            norm_topk_prob, times routed_scaling_factor
//   output   shared_experts(x) + Σ weight × expert(x)
// Tokens travel to their experts in batches (sorted by expert, index_select in, index_add out),
// never one by one.
//
// Tensor parallelism: the shared experts are split as a dense MLP is (layers.h), the routed ones
// are not (DeepSeek's expert tensor parallelism 1). Each rank of a tp group routes its own tokens:
// with sequence parallelism the part of the sequence it holds, without it the tp-th part of the
// whole sequence every rank holds, the routed outputs then summed over the group. The expert grid
// spans the tp ranks (parallel_grid.h), so the exchange receives every token once, and a routed
// expert's gradient on each rank is that of the tokens it computed: their sum over the experts'
// copies (edp) is the whole batch's. The router's gradient is its rank's tokens' alone, summed over
// the group by training (tensor_parallel_partial_gradient in parameter_shapes.h).
//
// Expert parallelism: a layer may hold a contiguous part of the routed experts (the shard of its
// ExpertExchange), under their global names. It still routes its own tokens over all experts;
// the exchange takes the rows to their experts' holders and back (expert_exchange.h).
//
// Balance: the sequence-wise auxiliary loss (V3 eq. 17-20, weight aux_loss_alpha) joins the
// gradient through the layer's output (attach_auxiliary_loss), and each forward pass in training
// counts the tokens each expert received (expert_load), from which a post-step hook of the
// optimizer (optim/moe_balancing.h) updates the bias (update_bias) with the whole batch's counts,
// the same on every rank.
#pragma once

#include "dstrain/core/torch_api.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/model/compute_options.h"
#include "dstrain/model/expert_exchange.h"
#include "dstrain/model/grouped_experts.h"
#include "dstrain/model/layer_slice.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/model_config.h"

namespace dstrain {

// Which experts each token goes to, and with what weight.
struct Routing {
  torch::Tensor experts;  // [tokens, k] int64
  torch::Tensor weights;  // [tokens, k] fp32
  torch::Tensor scores;   // [tokens, experts] fp32: the router's scores (before bias and groups)
};

// The router's choice from fp32 logits [tokens, experts] (a pure function: the tests check it
// against a direct computation). `bias`: [experts] or undefined.
Routing route_tokens(const torch::Tensor& logits, const torch::Tensor& bias, const ModelConfig& config);

// The sequence-wise balance loss of `routing` over `sequences` sequences of equal length:
// alpha × mean over sequences of Σ_i f_i P_i, with f_i = E / (k T) × (tokens of the sequence
// sent to expert i) and P_i the mean over its tokens of expert i's score normalised over experts.
// With `sum_over_parts` (tensor and context parallelism: in place, the sum over the ranks holding
// the other parts of the same sequences), `routing` holds this rank's part of each sequence, which
// is `sequence_length` tokens long in all: f counts the whole sequences' choices (summed over the
// parts) and P sums this rank's tokens alone, so that the parts' losses add up to the whole
// sequences' loss and each rank's gradient is its own tokens'.
torch::Tensor sequence_balance_loss(const Routing& routing, int64_t sequences, const ModelConfig& config,
                                    const std::function<void(torch::Tensor&)>& sum_over_parts = {},
                                    int64_t sequence_length = 0);

class MoEImpl : public torch::nn::Module {
 public:
  // The routed experts it holds are its options' expert_exchange's shard (all of them, computed
  // here, without one). `unrouted_tail`: under context parallelism, the last positions of the
  // whole sequence that have no target (a multi-token prediction module's, which runs on the whole
  // sequence): not routed, so that they count in no expert's load nor in the balance loss; their
  // output is zero.
  explicit MoEImpl(const ModelConfig& config, const ComputeOptions& options = {}, int64_t unrouted_tail = 0);
  // x [B, S, hidden]. `pass`: a rerun inside the backward pass (full recomputation) counts nothing again.
  torch::Tensor forward(const torch::Tensor& x, Pass pass = Pass::kFirst);

  const ExpertShard& expert_shard() const { return shard_; }
  // Expert parallelism's measures since the last update_bias: the number of distinct group ranks
  // each routed token reached, summed over tokens, and those tokens, fp32 0-d each (training
  // passes only).
  const torch::Tensor& ranks_reached() const { return ranks_reached_; }
  const torch::Tensor& routed_tokens() const { return routed_tokens_; }

  // Tokens each routed expert received in training forward passes since the last reset, fp32 [experts].
  torch::Tensor& expert_load() { return load_; }
  // The sum of those passes' sequence-wise balance losses (× aux_loss_alpha), fp32 0-d: what the
  // metrics report.
  torch::Tensor& balance_loss() { return balance_loss_; }
  // V3's auxiliary-loss-free balancing: bias += gamma × sign(mean load − load), then the counts
  // and the balance loss restart. `load`: the counts of the whole step, summed over the data-parallel ranks.
  // `skipped`: a 0-d fp32 tensor, 1 when the optimizer skipped the step (non-finite gradients),
  // which then leaves the bias as it is too; on the device, so that nothing waits for it.
  void update_bias(const torch::Tensor& load, double gamma, const torch::Tensor& skipped);
  const torch::Tensor& bias() const { return bias_; }
  // The gradient the balance loss receives in the next training passes: the factor the step's
  // backward pass gives the main loss (loss scale / micro-batches), a 0-dim tensor; 1 when unset.
  void set_auxiliary_loss_gradient_factor(const torch::Tensor& factor) { aux_gradient_factor_ = factor; }

 private:
  // The layer's output for x [B, S', hidden], this rank's routed positions of sequences that are
  // `whole` positions long.
  torch::Tensor forward_routed(const torch::Tensor& x, int64_t whole, Pass pass);
  // expert(row) for the (token, choice) rows `inputs`, sorted by expert (`counts` of each, on the
  // device), computed by the experts' holders (here, or across the exchange).
  torch::Tensor routed_experts(const torch::Tensor& inputs, const torch::Tensor& counts);
  // Routes and computes `flat` [sequences × S', hidden], the tokens this rank routes (S' of each
  // sequence): the routed experts' output for them, and in training with aux_loss_alpha the
  // balance loss of the whole sequences (`seq` tokens each) in `balance`.
  torch::Tensor route_and_compute(const torch::Tensor& flat, int64_t sequences, int64_t seq, Pass pass,
                                  torch::Tensor& balance);
  void count_ranks_reached(const torch::Tensor& chosen);

  ModelConfig config_;
  TensorParallelRegion tp_;
  ContextParallelGroup* cp_;
  int64_t unrouted_tail_;
  std::unique_ptr<ExpertExchange> local_exchange_;  // without one handed in
  ExpertExchange* exchange_;
  ExpertShard shard_;
  torch::Tensor gate_weight_, bias_, load_, balance_loss_, aux_gradient_factor_, ranks_reached_, routed_tokens_;
  GroupedExperts experts_{nullptr};  // the routed experts held
  SwiGLU shared_experts_{nullptr};
};
TORCH_MODULE(MoE);

// Whether a parameter name (a global one, as checkpoints have it) is a routed expert's:
// "...mlp.experts.<i>...", not the shared experts'.
bool is_routed_expert_parameter(const std::string& name);

// Returns `output` unchanged; its backward pass also sends `gradient_factor` (a 0-dim tensor; 1
// when undefined) into `aux` as d(objective)/d(aux): the auxiliary loss joins the backward pass
// through the layer output it is attached to, with the factor the step gives the main loss, as
// Megatron's MoEAuxLossAutoScaler does.
torch::Tensor attach_auxiliary_loss(const torch::Tensor& output, const torch::Tensor& aux,
                                    const torch::Tensor& gradient_factor);

}  // namespace dstrain
