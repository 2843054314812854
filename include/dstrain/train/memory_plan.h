// The memory one rank needs for a configuration's layout, from the configuration alone (what
// `dstrain model info` reports): parameters, gradients, optimizer state and a training step's
// activations on the most loaded pipeline stage.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dstrain/model/activation_memory.h"
#include "dstrain/model/layer_slice.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

// Bytes one rank holds.
struct MemoryPlan {
  double parameters = 0, gradients = 0, optimizer_state = 0, activations = 0;
  // train.fp8: the decoder layers' weights quantized once a step and kept (model/fp8_weight_cache.h)
  double fp8_weight_copies = 0;
  std::map<Recompute, double> activations_by_recompute;  // the step's peak, by train.recompute
  // What a rank holds from the start of a step to its end, known exactly, unlike activations.
  double state() const { return parameters + gradients + optimizer_state + fp8_weight_copies; }
  double total() const { return state() + activations; }
};

// The parameters of a pipeline stage's model chunks: those every data-parallel rank holds (of
// which tensor parallelism splits `split`: tensor_parallel_split), and the routed experts
// (multi-token prediction modules' included), which parallel.ep ranks share.
struct StageParameters {
  double replicated = 0, routed_experts = 0, split = 0;
};
StageParameters stage_parameters(const ModelConfig& model, const std::vector<LayerSlice>& chunks);

// The fused operations (model/activation_memory.h) of this build on the configuration's
// train.device (auto: cuda where this host has a GPU, as a run chooses), with its
// train.cuda_kernels.
FusedOperations fused_operations(const TrainConfig& config);

// Per rank of the configuration's grid (parallel_grid.h): the replicated parameters whole (the
// split ones 1/tp) and 1/ep of the routed experts, their fp32 gradients, and their optimizer
// state (fp32 moments, and fp32
// masters unless the parameters are fp32), which ZeRO-1 shards over the ranks holding the same
// parameters: the dp-cp group for the replicated part, the edp group for the experts; with
// train.fp8 the FP8 copies of the decoder layers' weights held, a byte an element (two where the
// recipe quantizes a weight in other tiles for the input gradient: rowwise), scales aside. The state
// is that of the stage holding the most; the activations those of the stage whose step peaks
// highest.
MemoryPlan plan_memory(const TrainConfig& config, const FusedOperations& fused);

// Before anything is allocated: the plan's state (parameters, gradients, optimizer state and FP8
// weight copies) for each of `ranks_sharing` ranks
// against the `memory_bytes` of `memory` they share. Throws Error(kOutOfMemory) naming all three
// and what needs less: on the CPU Linux grants a larger request and kills the process without a
// word once it touches what is not there; on a GPU the run would fail only once built. A memory
// of 0 bytes (unknown) is not checked.
void require_state_fits(const MemoryPlan& plan, int ranks_sharing, int64_t memory_bytes, const std::string& memory);

}  // namespace dstrain
