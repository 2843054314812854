// This rank's part of the model on its layout, as `train`, `eval` and `bench step` all run it:
// the model chunks of its pipeline stage (virtual stage c × pp + stage for each of its chunks),
// the executor that runs them on the configured schedule, and the options of the loader that
// feeds them its data-parallel share of each global batch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/ckpt/training_checkpoint.h"
#include "dstrain/data/loader.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/model/compute_options.h"
#include "dstrain/model/context_parallel.h"
#include "dstrain/model/layer_slice.h"
#include "dstrain/model/tensor_parallel.h"
#include "dstrain/parallel/expert_all_to_all.h"
#include "dstrain/pipeline/executor.h"
#include "dstrain/pipeline/weight_gradient_store.h"
#include "dstrain/train/language_model_stage.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

struct RankStage {
  std::vector<LayerSlice> slices;  // of every virtual stage of the pipeline, in order
  // What the chunks' modules were handed (ComputeOptions), before the chunks that use them, so
  // that they go after them. (A RankStage is built whole and moved into an empty one, never
  // assigned over a built one, whose members would go in declaration order.)
  std::unique_ptr<RerunClock> rerun_clock;
  std::unique_ptr<WeightGradientStore> weight_gradients;
  std::unique_ptr<ExpertAllToAll> expert_exchange;  // expert parallelism only
  std::unique_ptr<TensorParallelGroup> tensor_parallel;  // tensor parallelism only
  std::unique_ptr<ContextParallelGroup> context_parallel;  // context parallelism only
  std::unique_ptr<LanguageModelStage> model;
  std::unique_ptr<PipelineExecutor> executor;

  const std::vector<CausalLM>& chunks() const { return model->models(); }
  // Every parameter of this rank's chunks by global name, sorted by name, as checkpoints name
  // them (sorted_parameters: a view per routed expert).
  NamedTensors parameters() const;
  // The same as the chunks hold them (module_parameters: the experts stacked), what the
  // optimizer updates.
  NamedTensors module_parameters() const;
  // The global number of the first routed expert this rank holds (0 without expert parallelism).
  int64_t first_expert(const ModelConfig& config) const;
  // Layers per virtual stage, "2,2": what a checkpoint records of the split.
  std::string layers_per_virtual_stage() const;
};

// How the chunks' modules compute (train.recompute, train.cuda_kernels, train.grouped_experts),
// without the rank's exchanges and deferral: what a model on one process (generate) takes too.
ComputeOptions compute_options(const LoopConfig& loop);

// Initial parameters: from (run.seed, name) alone, so that every layout starts alike; or left
// for a checkpoint to fill (evaluation).
enum class Initialization { kFromSeed, kNone };

// The chunks on `device` in train.precision (the MoE balancing bias stays fp32).
RankStage build_rank_stage(const TrainConfig& config, ParallelContext& parallel, const torch::Device& device,
                           Initialization initialization);

// Where this rank's parameters lie in the whole tensors of a checkpoint (tensor_parallel_split),
// and which of the ranks holding the same tensors write them: the whole ones the tp group's first
// rank, with its data-parallel replicas; the blocks the first of those replicas.
TensorParallelPlacement tensor_parallel_placement(const ParallelContext& parallel);

// The micro-batches of one step (or evaluated global batch) from `loader`, all read at the first
// request, in pinned host memory where it is a GPU's: the copies overlap the kernels queued.
PipelineExecutor::BatchSource step_batches(DataLoader& loader, int64_t micro_batches, const torch::Device& device);

// Which micro-batches of which global batch this rank reads, and how.
LoaderOptions rank_loader_options(const TrainConfig& config, const ParallelContext& parallel,
                                  const torch::Device& device);

}  // namespace dstrain
