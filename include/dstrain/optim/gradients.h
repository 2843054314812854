// What happens to gradients between the backward pass and the optimizer: averaging over the
// data-parallel group and clipping by the global norm.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

#include "dstrain/dist/communicator.h"

namespace dstrain {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Averages every parameter's gradient over `dp_group`, packed into one flat buffer so that a
// single all-reduce carries them all. The order is the order of `params`: the same on every rank.
void average_gradients(const NamedTensors& params, Communicator& dp_group);

// The L2 norm of all gradients, summed in fp64. `model_group` (the pipeline stages holding the
// other parameters; nullptr when this rank holds them all) adds the other stages' squares.
double global_grad_norm(const NamedTensors& params, Communicator* model_group);

// Scales the gradients so that their global norm is at most `max_norm` (as
// torch.nn.utils.clip_grad_norm_); no-op when max_norm is 0 or the norm is already smaller.
void clip_gradients(const NamedTensors& params, double norm, double max_norm);

}  // namespace dstrain
