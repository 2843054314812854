// DeepSeek-V3's auxiliary-loss-free balancing as a post-step hook: after each step, the tokens
// every routed expert of this stage's MoE layers received (every micro-batch, summed over the
// ranks of the stage that route other tokens: the dp-cp group) move the layer's bias
// (MoEImpl::update_bias), the same way on every rank.
// The same reduction brings the sequence-wise balance loss, which the hook reports, and under
// expert parallelism the measures of the token exchange: how evenly the expert-parallel ranks are
// loaded, and how many of them a token reaches.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "dstrain/parallel/communicator.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/moe.h"
#include "dstrain/optim/post_step_hook.h"

namespace dstrain {

class MoeBalancing : public PostStepHook {
 public:
  // `layers`: this stage's MoE layers by global layer index (none on a stage without them);
  // `token_group`: the stage's ranks that route other tokens (their loads are summed over it),
  // whose `context_parts` ranks in a row route parts of the same sequences (context parallelism);
  // `sequence_parts`: further ranks routing parts of the same sequences (tensor parallelism: loads
  // and balance losses, each rank's its part's, are summed over it too); `micro_batches`: per rank
  // and step; `device`: the model's.
  MoeBalancing(std::vector<std::pair<int64_t, MoE>> layers, Communicator& token_group, int context_parts,
               Communicator& sequence_parts, const ModelConfig& model, int64_t micro_batches,
               const torch::Device& device);

  void after_step(const torch::Tensor& skipped) override;
  // The micro-batches of the coming step on each rank (a batch-size ramp-up changes them).
  void set_micro_batches(int64_t micro_batches) {
    loss_divisor_ = static_cast<double>(micro_batches * (token_group_.size() / context_parts_));
  }
  // "balance_loss" (with model.aux_loss_alpha): the step's balance loss of this stage's layers,
  // mean over micro-batches and the token group's ranks, summed over layers; 0 without MoE layers.
  std::vector<std::pair<std::string, torch::Tensor>> step_values() const override;
  // The last step's max/mean of the tokens each layer's experts received (1 is perfect
  // balance), by global layer index; empty before the first step or without MoE layers.
  // Synchronises.
  std::vector<std::pair<int64_t, double>> expert_balance() const;
  // Expert parallelism (empty without it), by global layer index, the last step's: max/mean of
  // the tokens each expert-parallel rank received (summed over the expert-parallel groups), and
  // the mean number of expert-parallel ranks a token was sent to. Synchronise.
  std::vector<std::pair<int64_t, double>> ep_rank_balance() const;
  std::vector<std::pair<int64_t, double>> ep_ranks_per_token() const;

 private:
  std::vector<std::pair<int64_t, MoE>> layers_;
  Communicator& token_group_;
  int context_parts_;
  Communicator& sequence_parts_;
  int64_t experts_;
  double bias_update_speed_;
  bool reports_balance_loss_;
  double loss_divisor_;  // micro-batches × ranks of the token group
  torch::Device device_;
  torch::Tensor balance_loss_;  // the last step's
  torch::Tensor balance_;       // the last step's max/mean expert load of each layer
  int64_t expert_parts_;        // the expert-parallel ranks the layers' experts are split over
  torch::Tensor ep_balance_, ep_ranks_per_token_;  // the last step's, each layer's (expert parallelism)
};

}  // namespace dstrain
