// The adapter between the routed experts' module layout and the checkpoints' for the optimizer
// state. A MoE layer holds each projection of its experts stacked, [experts, out, in]
// (model/grouped_experts.h), and so the optimizer holds one state for it, or under ZeRO-1 a
// flat shard of one; checkpoints keep Hugging Face's tensor per expert, so that a run resumes
// on any other expert-parallel, data-parallel or pipeline layout, and export and import see the
// usual names. (The parameters themselves get the same treatment from sorted_parameters.)
#pragma once

#include <vector>

#include "dstrain/ckpt/training_checkpoint.h"

namespace dstrain {

// `views` with each stacked expert state split into its experts' parts: a view per expert (or,
// for a shard, per expert it overlaps), named expert_weight_name(name, first_expert + e), with
// that expert's shape and the piece's offset within it. The parts are views of the optimizer's
// tensors: reading a checkpoint into them fills the state. Other views pass as they are.
std::vector<OptimizerStateView> per_expert_state_views(const std::vector<OptimizerStateView>& views,
                                                       int64_t first_expert);

}  // namespace dstrain
