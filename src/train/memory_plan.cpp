#include "dstrain/train/memory_plan.h"

#include <algorithm>
#include <map>
#include <string>

#include "dstrain/ckpt/hf_fp8.h"
#include "dstrain/core/error.h"
#include "dstrain/core/text.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/parallel/device.h"
#include "dstrain/parallel/parallel_grid.h"
#include "dstrain/model/activation_memory.h"
#include "dstrain/model/cuda_kernels.h"
#include "dstrain/model/flops.h"
#include "dstrain/model/fp8_matmul.h"
#include "dstrain/model/parameter_shapes.h"
#include "dstrain/pipeline/partition.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/simulator.h"

namespace dstrain {
namespace {

double element_bytes(torch::ScalarType precision) { return static_cast<double>(c10::elementSize(precision)); }

// Parameters, gradients and optimizer state of one rank of a stage holding `stage`.
MemoryPlan state_memory(const TrainConfig& c, const ParallelGrid& grid, const StageParameters& stage) {
  const double element = element_bytes(c.loop.precision);
  const double experts = stage.routed_experts / grid.size(Group::kEp);  // the part of them a rank holds
  const double replicated = stage.replicated - stage.split + stage.split / grid.size(Group::kTp);
  const double held = replicated + experts;
  const double state_per_parameter = 8.0 + (element == 4 ? 0.0 : 4.0);  // moments (+ masters)
  // ZeRO-1: each rank keeps a share of the state of what its group of replicas holds.
  const double sharded =
      c.optim.zero == 1 ? replicated / grid.size(Group::kDpCp) + experts / grid.size(Group::kEdp) : held;
  MemoryPlan plan;
  plan.parameters = held * element;
  plan.gradients = held * 4;  // the fp32 gradient buffer
  plan.optimizer_state = sharded * state_per_parameter;
  return plan;
}

// The sum of `by_layer` over the decoder layers a stage holding `chunks` has: its slices' layers,
// and with the head the multi-token prediction modules' (numbered after the last).
double over_layers_held(const ModelConfig& m, const std::vector<LayerSlice>& chunks,
                        std::map<int64_t, double>& by_layer) {
  double sum = 0;
  for (const LayerSlice& slice : chunks) {
    for (int64_t layer = slice.first; layer < slice.last; ++layer) sum += by_layer[layer];
    if (slice.has_head)
      for (int64_t depth = 0; depth < m.num_nextn_predict_layers; ++depth) sum += by_layer[m.num_layers + depth];
  }
  return sum;
}

// A weight's FP8 copies under `recipe`: the forward product's, and the input gradient's where it
// takes other tiles (model/fp8_weight_cache.h keeps both).
double fp8_copy_bytes(int64_t rows, int64_t columns, Fp8Recipe recipe) {
  const Fp8Tiling tiling = fp8_tiling(recipe);
  const double forward = static_cast<double>(fp8_quantized_bytes(rows, columns, tiling.weight));
  return tiling.weight == tiling.weight_for_input_grad
             ? forward
             : forward + static_cast<double>(fp8_quantized_bytes(rows, columns, tiling.weight_for_input_grad));
}

// The FP8 weight copies a rank keeps of each decoder layer (plan_memory): of the weights DeepSeek's
// FP8 layout holds in FP8 (ckpt/hf_fp8.h), which are those FP8 training quantizes.
std::map<int64_t, double> fp8_weight_copies_by_layer(const TrainConfig& c, const ParallelGrid& grid,
                                                     const FusedOperations& fused) {
  std::map<int64_t, double> by_layer;
  if (c.loop.fp8 == Fp8Recipe::kNone) return by_layer;
  const Fp8Recipe experts = experts_recipe(c.loop.fp8, fused.fp8_grouped_experts);
  const int64_t tp = grid.size(Group::kTp), ep = grid.size(Group::kEp);
  for (const auto& [name, shape] : parameter_shapes(c.model)) {
    if (!hf_fp8_quantizes(name, shape)) continue;
    double& bytes = by_layer[parameter_layer(name)];
    if (name.find(".mlp.experts.") != std::string::npos) {
      bytes += fp8_copy_bytes(shape[0], shape[1], experts) / static_cast<double>(ep);
      continue;
    }
    const int64_t split = tensor_parallel_dim(name);  // a rank's block of rows or columns
    bytes += fp8_copy_bytes(split == 0 ? shape[0] / tp : shape[0], split == 1 ? shape[1] / tp : shape[1], c.loop.fp8);
  }
  return by_layer;
}

ActivationMemoryOptions activation_options(const TrainConfig& c, const ParallelGrid& grid,
                                           const FusedOperations& fused) {
  ActivationMemoryOptions o;
  o.micro_batch = c.loop.micro_batch;
  o.context_parallel = grid.size(Group::kCp);
  o.context_parallel_latent = c.parallel.cp_latent;
  o.seq_len = c.loop.seq_len / o.context_parallel;  // a rank's chunks
  o.element_bytes = static_cast<int64_t>(element_bytes(c.loop.precision));
  o.fp8 = c.loop.fp8;
  o.fused = fused;
  o.tokens_exchanged = grid.size(Group::kEp) > 1;
  o.tensor_parallel = grid.size(Group::kTp);
  o.sequence_parallel = c.parallel.sequence_parallel;
  return o;
}

// What each stage holds at once as the schedule runs: for every state the simulator reaches,
// the micro-batches awaiting their backward pass (activations kept) and those awaiting only their
// weight gradients (zero-bubble schedules). The simulator counts (micro-batch, chunk) pairs; a
// stage's chunks are taken as equal, each a 1/v share of a micro-batch on the stage. GPipe keeps
// every micro-batch on every stage, 1F1B's stage s keeps pp − s, so that the last stage, where
// the head and the multi-token prediction modules sit, keeps one.
// Each state also says its moment (ActivationMemoryOptions: what is made then besides).
std::vector<std::vector<ActivationMemoryOptions>> micro_batches_held(const Schedule& schedule,
                                                                     const ActivationMemoryOptions& options) {
  const double v = schedule.virtual_stages;
  std::vector<std::vector<ActivationMemoryOptions>> held;
  for (const std::vector<LiveState>& states : simulate(schedule, SimulationCosts{}).live_states) {
    held.emplace_back();
    for (const LiveState& state : states) {
      ActivationMemoryOptions o = options;
      o.micro_batches_in_flight = state.awaiting_backward / v;
      o.micro_batches_awaiting_weights = state.awaiting_weights / v;
      o.forward_ended = state.reached_by == ActionKind::kForward;
      o.backward_starting = state.backward_next;
      o.backward_ended = state.reached_by == ActionKind::kBackward;
      held.back().push_back(o);
    }
  }
  return held;
}

}  // namespace

namespace {

// The parameters tensor parallelism splits, by decoder layer (multi-token prediction modules'
// numbered after the last); the embedding's and the head's under -1 and -2.
std::map<int64_t, double> split_parameters_by_layer(const ModelConfig& m) {
  std::map<int64_t, double> split;
  for (const auto& [name, shape] : parameter_shapes(m)) {
    if (tensor_parallel_split(name) == TensorParallelSplit::kWhole) continue;
    int64_t layer = parameter_layer(name);
    if (layer < 0) layer = name.find("embed_tokens") != std::string::npos ? -1 : -2;
    split[layer] += static_cast<double>(c10::multiply_integers(shape));
  }
  return split;
}

}  // namespace

StageParameters stage_parameters(const ModelConfig& m, const std::vector<LayerSlice>& chunks) {
  StageParameters p;
  std::map<int64_t, double> split = split_parameters_by_layer(m);
  for (const LayerSlice& slice : chunks) {
    if (slice.has_embedding) p.split += split[-1];
    if (slice.has_head) p.split += split[-2];
  }
  p.split += over_layers_held(m, chunks, split);
  const double h = static_cast<double>(m.hidden_size), vocab = static_cast<double>(m.vocab_size);
  for (const LayerSlice& slice : chunks) {
    if (slice.has_embedding) p.replicated += vocab * h;
    if (slice.has_head) p.replicated += vocab * h + h;  // lm_head and the final norm
    for (int64_t layer = slice.first; layer < slice.last; ++layer) {
      const double experts = static_cast<double>(layer_routed_expert_parameters(m, layer));
      p.routed_experts += experts;
      p.replicated += static_cast<double>(layer_parameters(m, layer)) - experts;
    }
    if (!slice.has_head) continue;
    // The multi-token prediction modules sit with the head; each has a decoder layer of its own.
    const double mtp_experts =
        static_cast<double>(m.num_nextn_predict_layers * layer_routed_expert_parameters(m, m.num_layers));
    p.routed_experts += mtp_experts;
    p.replicated += static_cast<double>(count_parameters(m).mtp) - mtp_experts;
  }
  return p;
}

FusedOperations fused_operations(const TrainConfig& c) {
  const bool cuda = computes_on_gpu(c.loop.device);
  const bool own_kernels = cuda && cuda_kernels_built() && c.loop.cuda_kernels;
  return {compat::kHasFusedAttention, cuda && compat::kHasFusedRmsNormOnCuda, own_kernels, own_kernels,
          cuda && fp8_grouped_kernel_on(0)};
}

MemoryPlan plan_memory(const TrainConfig& c, const FusedOperations& fused) {
  const ParallelGrid grid(c.parallel);
  const int pp = grid.size(Group::kPp), chunks = c.pipeline.virtual_stages;
  const std::vector<LayerSlice> slices =
      partition_layers(c.model, c.loop.seq_len, pp * chunks, c.pipeline.stage_layers);
  const Schedule schedule = make_schedule(c.pipeline.schedule, pp, chunks, static_cast<int>(c.loop.grad_accum));
  const std::vector<std::vector<ActivationMemoryOptions>> held =
      micro_batches_held(schedule, activation_options(c, grid, fused));
  std::map<int64_t, double> fp8_copies = fp8_weight_copies_by_layer(c, grid, fused);
  MemoryPlan plan;
  for (int stage = 0; stage < pp; ++stage) {
    std::vector<LayerSlice> mine;
    for (int chunk = 0; chunk < chunks; ++chunk)
      mine.push_back(slices[static_cast<size_t>(schedule.virtual_stage(stage, chunk))]);
    MemoryPlan state = state_memory(c, grid, stage_parameters(c.model, mine));
    state.fp8_weight_copies = over_layers_held(c.model, mine, fp8_copies);
    if (state.state() > plan.state()) {
      plan.parameters = state.parameters;
      plan.gradients = state.gradients;
      plan.optimizer_state = state.optimizer_state;
      plan.fp8_weight_copies = state.fp8_weight_copies;
    }
    for (const auto& [name, mode] : recompute_names()) {
      const bool configured = mode == c.loop.recompute;
      double& peak = plan.activations_by_recompute[mode];
      for (ActivationMemoryOptions options : held[static_cast<size_t>(stage)]) {
        options.recompute = {mode, configured ? c.loop.recompute_layers : 0};
        peak = std::max(peak, step_activation_bytes(c.model, mine, options));
      }
    }
  }
  plan.activations = plan.activations_by_recompute.at(c.loop.recompute);
  return plan;
}

void require_state_fits(const MemoryPlan& plan, int ranks_sharing, int64_t memory_bytes, const std::string& memory) {
  const double state = plan.state();
  if (memory_bytes <= 0 || state * ranks_sharing <= static_cast<double>(memory_bytes)) return;
  const std::string shared =
      ranks_sharing == 1 ? ", and " + memory + " has "
                         : ", " + format_bytes(state * ranks_sharing) + " for the " + std::to_string(ranks_sharing) +
                               " ranks that share " + memory + ", which has ";
  throw Error(ExitCode::kOutOfMemory,
              "out of memory before the start: a rank's parameters, gradients and optimizer state" +
                  std::string(plan.fp8_weight_copies > 0 ? " with its FP8 weight copies" : "") + " take " +
                  format_bytes(state) + " (`dstrain model info` plans them)" + shared +
                  format_bytes(static_cast<double>(memory_bytes)) +
                  "; spread the layers over more pipeline stages (parallel.pp), split the routed experts "
                  "(parallel.ep), shard the optimizer state (optim.zero = 1), or run fewer ranks on each node");
}

}  // namespace dstrain
