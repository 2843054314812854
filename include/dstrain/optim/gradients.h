// What happens to gradients between their average over the data-parallel group (the gradient
// buffer's) and the optimizer: the global norm and clipping. Everything stays on the device: the
// norm is a tensor that the host reads only when it logs. Clipping (and fp16's unscaling) is a
// divisor that the optimizer applies as it reads each gradient, not a pass of its own over them.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/parallel/communicator.h"
#include "dstrain/optim/grad_buffer.h"

namespace dstrain {

// The L2 norm of every gradient, as a 0-dim fp32 tensor. `model_group` (the pipeline stages
// holding the other parameters; nullptr when this rank holds them all) adds their squares; a
// sharded buffer (ZeRO-1) adds those of the other shards from its own group.
torch::Tensor global_grad_norm(GradientBuffer& buffer, Communicator* model_group);
// The sum of the squares of the buffer's gradients, over its shards when sharded: 1-element fp32.
torch::Tensor squared_grad_norm(GradientBuffer& buffer);

// What to divide gradients of global norm `norm` by so that theirs is at most `max_norm`, as
// torch.nn.utils.clip_grad_norm_ scales them (coefficient max_norm / (norm + 1e-6), capped at 1):
// the inverse of that coefficient, 0-dim; one when max_norm is 0.
torch::Tensor clip_divisor(const torch::Tensor& norm, double max_norm);

}  // namespace dstrain
