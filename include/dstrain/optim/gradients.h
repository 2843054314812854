// What happens to gradients between their average over the data-parallel group (the gradient
// buffer's) and the optimizer: the global norm and clipping. Everything stays on the device: the
// norm is a tensor that the host reads only when it logs.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/dist/communicator.h"
#include "dstrain/optim/grad_buffer.h"

namespace dstrain {

// The L2 norm of every gradient, as a 0-dim fp32 tensor. `model_group` (the pipeline stages
// holding the other parameters; nullptr when this rank holds them all) adds their squares; a
// sharded buffer (ZeRO-1) adds those of the other shards from its own group.
torch::Tensor global_grad_norm(GradientBuffer& buffer, Communicator* model_group);

// Scales the gradients so that their global norm is at most `max_norm`, as
// torch.nn.utils.clip_grad_norm_ does (coefficient max_norm / (norm + 1e-6), capped at 1);
// no-op when max_norm is 0.
void clip_gradients(GradientBuffer& buffer, const torch::Tensor& norm, double max_norm);

}  // namespace dstrain
