#include "dstrain/optim/moe_balancing.h"

namespace dstrain {

MoeBalancing::MoeBalancing(std::vector<std::pair<int64_t, MoE>> layers, Communicator& token_group, int context_parts,
                           Communicator& sequence_parts, const ModelConfig& model, int64_t micro_batches,
                           const torch::Device& device)
    : layers_(std::move(layers)),
      token_group_(token_group),
      context_parts_(context_parts),
      sequence_parts_(sequence_parts),
      experts_(model.n_routed_experts),
      bias_update_speed_(model.bias_update_speed),
      reports_balance_loss_(model.aux_loss_alpha > 0),
      loss_divisor_(static_cast<double>(micro_batches * (token_group.size() / context_parts))),
      device_(device),
      expert_parts_(layers_.empty() ? 1 : layers_.front().second->expert_shard().count) {}

namespace {

std::vector<std::pair<int64_t, double>> by_layer(const std::vector<std::pair<int64_t, MoE>>& layers,
                                                 const torch::Tensor& values) {
  std::vector<std::pair<int64_t, double>> result;
  if (!values.defined()) return result;
  const torch::Tensor host = values.to(torch::kCPU, torch::kFloat64);
  for (size_t i = 0; i < layers.size(); ++i) result.emplace_back(layers[i].first, host[static_cast<int64_t>(i)].item<double>());
  return result;
}

}  // namespace

void MoeBalancing::after_step(const torch::Tensor& skipped) {
  if (layers_.empty()) return;
  torch::NoGradGuard no_grad;
  // The whole step's expert loads (every micro-batch, every data-parallel rank) and, in a last
  // column, balance losses (and the exchange's counts), in one reduction for all layers: the bias
  // moves the same way on every rank.
  std::vector<torch::Tensor> rows;
  for (auto& [index, moe] : layers_)
    rows.push_back(torch::cat({moe->expert_load(), moe->balance_loss().reshape({1}), moe->ranks_reached().reshape({1}),
                               moe->routed_tokens().reshape({1})}));
  torch::Tensor all = torch::stack(rows);
  token_group_.all_reduce(all, ReduceOp::kSum);
  if (sequence_parts_.size() > 1) sequence_parts_.all_reduce(all, ReduceOp::kSum);
  const torch::Tensor loads = all.narrow(1, 0, experts_);
  for (size_t i = 0; i < layers_.size(); ++i)
    layers_[i].second->update_bias(loads[static_cast<int64_t>(i)], bias_update_speed_, skipped);
  balance_ = std::get<0>(loads.max(1)) / loads.mean(1);
  if (reports_balance_loss_) balance_loss_ = all.select(1, experts_).sum() / loss_divisor_;
  if (expert_parts_ > 1) {
    const torch::Tensor rank_loads = loads.reshape({loads.size(0), expert_parts_, experts_ / expert_parts_}).sum(2);
    ep_balance_ = std::get<0>(rank_loads.max(1)) / rank_loads.mean(1);
    ep_ranks_per_token_ = all.select(1, experts_ + 1) / all.select(1, experts_ + 2);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> MoeBalancing::step_values() const {
  if (!reports_balance_loss_) return {};
  // A stage without MoE layers reports 0, so that every stage sends the same values.
  const torch::Tensor none = torch::zeros({}, torch::dtype(torch::kFloat32).device(device_));
  return {{"balance_loss", balance_loss_.defined() ? balance_loss_ : none}};
}

std::vector<std::pair<int64_t, double>> MoeBalancing::expert_balance() const { return by_layer(layers_, balance_); }

std::vector<std::pair<int64_t, double>> MoeBalancing::ep_rank_balance() const { return by_layer(layers_, ep_balance_); }

std::vector<std::pair<int64_t, double>> MoeBalancing::ep_ranks_per_token() const {
  return by_layer(layers_, ep_ranks_per_token_);
}

}  // namespace dstrain
