#include "dstrain/optim/gradients.h"

namespace dstrain {

torch::Tensor global_grad_norm(GradientBuffer& buffer, Communicator* model_group) {
  torch::NoGradGuard no_grad;
  Communicator* shard_group = buffer.shard_group();
  const bool sharded = shard_group != nullptr;
  const bool staged = model_group && model_group->size() > 1;
  if (!sharded) {
    torch::Tensor norm = buffer.flat().norm();
    if (!staged) return norm;
    torch::Tensor squares = (norm * norm).reshape({1});
    model_group->all_reduce(squares, ReduceOp::kSum);
    return squares.sqrt().reshape({});
  }
  torch::Tensor squares = squared_grad_norm(buffer);
  if (staged) model_group->all_reduce(squares, ReduceOp::kSum);
  return squares.sqrt().reshape({});
}

torch::Tensor squared_grad_norm(GradientBuffer& buffer) {
  torch::NoGradGuard no_grad;
  Communicator* shard_group = buffer.shard_group();
  if (!shard_group) {
    const torch::Tensor norm = buffer.flat().norm();
    return (norm * norm).reshape({1});
  }
  torch::Tensor squares = torch::zeros({1}, buffer.flat().options());
  for (const torch::Tensor& region : buffer.owned_regions()) squares += region.pow(2).sum();
  shard_group->all_reduce(squares, ReduceOp::kSum);
  return squares;
}

torch::Tensor clip_divisor(const torch::Tensor& norm, double max_norm) {
  torch::NoGradGuard no_grad;
  if (max_norm <= 0) return torch::ones_like(norm);
  return ((norm + 1e-6) / max_norm).clamp_min(1.0);
}

}  // namespace dstrain
