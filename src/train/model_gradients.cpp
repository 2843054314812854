#include "dstrain/train/model_gradients.h"

#include <cstdio>

#include <set>

#include "dstrain/model/moe.h"
#include "dstrain/optim/gradients.h"

namespace dstrain {
namespace {

// The parameters (and their use order) that `expert` says belong, or do not belong, to one buffer.
struct ParameterSet {
  NamedTensors params;
  std::vector<torch::Tensor> use_order;
};

ParameterSet select(const NamedTensors& params, const std::vector<torch::Tensor>& use_order, bool experts) {
  ParameterSet set;
  std::set<const void*> chosen;
  for (const auto& [name, p] : params)
    if (is_routed_expert_parameter(name) == experts) {
      set.params.emplace_back(name, p);
      chosen.insert(p.unsafeGetTensorImpl());
    }
  for (const torch::Tensor& p : use_order)
    if (chosen.count(p.unsafeGetTensorImpl())) set.use_order.push_back(p);
  return set;
}

}  // namespace

ModelGradients::ModelGradients(const NamedTensors& params, const std::vector<torch::Tensor>& use_order,
                               GradientReduction reduction, const GradientGroups& groups)
    : groups_(groups) {
  reduction.group = &groups.dense;
  if (&groups.experts == &groups.dense) {  // the same holders: one buffer
    replicated_ = std::make_unique<GradientBuffer>(params, use_order, reduction);
    return;
  }
  const ParameterSet replicated = select(params, use_order, false), experts = select(params, use_order, true);
  replicated_ = std::make_unique<GradientBuffer>(replicated.params, replicated.use_order, reduction);
  reduction.group = &groups.experts;
  reduction.divide_sum_by = groups.dense.size();
  experts_ = std::make_unique<GradientBuffer>(experts.params, experts.use_order, reduction);
}

void ModelGradients::zero() {
  replicated_->zero();
  if (experts_) experts_->zero();
}

void ModelGradients::reduce() {
  replicated_->reduce();
  if (experts_) experts_->reduce();
}

torch::Tensor ModelGradients::global_norm() {
  Communicator* stages = &groups_.stages;
  if (!experts_) return global_grad_norm(*replicated_, stages);
  torch::NoGradGuard no_grad;
  // The experts of the other ranks of the expert-parallel group are the rest of the layer's.
  torch::Tensor expert_squares = squared_grad_norm(*experts_);
  groups_.expert_parallel.all_reduce(expert_squares, ReduceOp::kSum);
  torch::Tensor squares = squared_grad_norm(*replicated_) + expert_squares;
  if (stages->size() > 1) stages->all_reduce(squares, ReduceOp::kSum);
  return squares.sqrt().reshape({});
}

std::vector<ParameterShard> ModelGradients::shards() const {
  std::vector<ParameterShard> all = replicated_->shards();
  if (experts_) all.insert(all.end(), experts_->shards().begin(), experts_->shards().end());
  return all;
}

std::vector<torch::Tensor> ModelGradients::shard_grads() const {
  std::vector<torch::Tensor> all = replicated_->shard_grads();
  if (experts_)
    for (torch::Tensor& grad : experts_->shard_grads()) all.push_back(grad);
  return all;
}

void ModelGradients::gather_parameters() {
  replicated_->gather_parameters();
  if (experts_) experts_->gather_parameters();
}

CommunicationRecord ModelGradients::communication() const {
  CommunicationRecord total = replicated_->communication();
  if (experts_) {
    total.exposed_s += experts_->communication().exposed_s;
    total.in_flight_s += experts_->communication().in_flight_s;
    total.bytes_sent += experts_->communication().bytes_sent;
  }
  return total;
}

void ModelGradients::set_microbatches(int64_t microbatches) {
  replicated_->set_microbatches(microbatches);
  if (experts_) experts_->set_microbatches(microbatches);
}

NamedTensors ModelGradients::error_feedback() {
  char rank[32];
  std::snprintf(rank, sizeof rank, "rank_%05d", groups_.world_rank);
  NamedTensors carried;
  if (replicated_->error_feedback().defined())
    carried.emplace_back(std::string("comm/error_feedback/replicated/") + rank, replicated_->error_feedback());
  if (experts_ && experts_->error_feedback().defined())
    carried.emplace_back(std::string("comm/error_feedback/experts/") + rank, experts_->error_feedback());
  return carried;
}

bool ModelGradients::writes_experts() const { return !experts_ || groups_.experts.rank() == 0; }

}  // namespace dstrain
