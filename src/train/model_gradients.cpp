#include "dstrain/train/model_gradients.h"

#include <cstdio>

#include <set>
#include <utility>

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
                               GradientReduction reduction, const GradientGroups& groups,
                               TensorParallelParameters tensor_parallel)
    : groups_(groups), tensor_parallel_(std::move(tensor_parallel)) {
  reduction.group = &groups.dense;
  const bool split = groups.tensor_parallel.size() > 1;
  const ParameterSet replicated = select(params, use_order, false), experts = select(params, use_order, true);
  const bool one_buffer = experts.params.empty() || (&groups.experts == &groups.dense && !split);  // the same holders
  replicated_ = one_buffer ? std::make_unique<GradientBuffer>(params, use_order, reduction)
                           : std::make_unique<GradientBuffer>(replicated.params, replicated.use_order, reduction);
  // The buffer's fp32 gradients (of this rank's shard under ZeRO-1: the tp group's ranks hold the
  // same shards of buffers laid out alike).
  if (split)
    for (const ParameterShard& shard : replicated_->shards())
      if (tensor_parallel_.partial_gradient(shard.name)) partial_grads_.push_back(shard.grad);
  if (one_buffer) return;
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
  if (!partial_grads_.empty()) sum_partial_gradients();
}

// In one all-reduce: the gradients are small (norms, routers, MLA's down-projections).
void ModelGradients::sum_partial_gradients() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat_grads;
  for (const torch::Tensor& grad : partial_grads_) flat_grads.push_back(grad.reshape({-1}));
  torch::Tensor flat = torch::cat(flat_grads);
  groups_.tensor_parallel.all_reduce(flat, ReduceOp::kSum);
  int64_t at = 0;
  for (torch::Tensor grad : partial_grads_) {
    grad.copy_(flat.narrow(0, at, grad.numel()).view_as(grad));
    at += grad.numel();
  }
}

torch::Tensor ModelGradients::tensor_parallel_squares() {
  torch::NoGradGuard no_grad;
  const bool counts_whole = groups_.tensor_parallel.rank() == 0;
  torch::Tensor squares = torch::zeros({1}, replicated_->flat().options());
  for (const ParameterShard& shard : replicated_->shards())
    if (counts_whole || tensor_parallel_.split(shard.name)) squares += shard.grad.pow(2).sum();
  if (Communicator* shards = replicated_->shard_group()) shards->all_reduce(squares, ReduceOp::kSum);
  groups_.tensor_parallel.all_reduce(squares, ReduceOp::kSum);
  return squares;
}

torch::Tensor ModelGradients::global_norm() {
  Communicator* stages = &groups_.stages;
  const bool split = groups_.tensor_parallel.size() > 1;
  if (!experts_ && !split) return global_grad_norm(*replicated_, stages);
  torch::NoGradGuard no_grad;
  torch::Tensor squares = split ? tensor_parallel_squares() : squared_grad_norm(*replicated_);
  if (experts_) {
    // The experts of the other ranks of the expert-parallel group are the rest of the layer's.
    torch::Tensor expert_squares = squared_grad_norm(*experts_);
    groups_.expert_parallel.all_reduce(expert_squares, ReduceOp::kSum);
    squares = squares + expert_squares;
  }
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
