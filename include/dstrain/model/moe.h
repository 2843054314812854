// DeepSeekMoE (DeepSeek-V2 §2.2, V3 §2.1.2), with Hugging Face's names: mlp.gate (the router,
// and in V3 its balancing bias e_score_correction_bias), mlp.experts.<i>.{gate,up,down}_proj,
// mlp.shared_experts.{gate,up,down}_proj.
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
// Balance: the sequence-wise auxiliary loss (V3 eq. 17-20, weight aux_loss_alpha) joins the
// gradient through the layer's output (attach_auxiliary_loss), and each forward pass in training
// counts the tokens each expert received (expert_load), from which a post-step hook of the
// optimizer (optim/moe_balancing.h) updates the bias (update_bias) with the whole batch's counts,
// the same on every rank.
#pragma once

#include "dstrain/core/torch_api.h"

#include <vector>

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
torch::Tensor sequence_balance_loss(const Routing& routing, int64_t sequences, const ModelConfig& config);

class MoEImpl : public torch::nn::Module {
 public:
  explicit MoEImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // [B, S, hidden]

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
  ModelConfig config_;
  torch::Tensor gate_weight_, bias_, load_, balance_loss_, aux_gradient_factor_;
  std::vector<SwiGLU> experts_;
  SwiGLU shared_experts_{nullptr};
};
TORCH_MODULE(MoE);

// Returns `output` unchanged; its backward pass also sends `gradient_factor` (a 0-dim tensor; 1
// when undefined) into `aux` as d(objective)/d(aux): the auxiliary loss joins the backward pass
// through the layer output it is attached to, with the factor the step gives the main loss, as
// Megatron's MoEAuxLossAutoScaler does.
torch::Tensor attach_auxiliary_loss(const torch::Tensor& output, const torch::Tensor& aux,
                                    const torch::Tensor& gradient_factor);

}  // namespace dstrain
