#include "dstrain/optim/gradients.h"

namespace dstrain {

torch::Tensor global_grad_norm(GradientBuffer& buffer, Communicator* model_group) {
  torch::NoGradGuard no_grad;
  torch::Tensor norm = buffer.flat().norm();
  if (!model_group || model_group->size() == 1) return norm;
  torch::Tensor squares = (norm * norm).reshape({1});
  model_group->all_reduce(squares, ReduceOp::kSum);
  return squares.sqrt().reshape({});
}

void clip_gradients(GradientBuffer& buffer, const torch::Tensor& norm, double max_norm) {
  if (max_norm <= 0) return;
  torch::NoGradGuard no_grad;
  buffer.flat().mul_((max_norm / (norm + 1e-6)).clamp_max(1.0));
}

}  // namespace dstrain
