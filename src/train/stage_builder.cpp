#include "dstrain/train/stage_builder.h"

#include <algorithm>

#include "dstrain/ckpt/format.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/model/fp8_matmul.h"
#include "dstrain/model/grouped_matmul.h"
#include "dstrain/model/parameter_shapes.h"
#include "dstrain/parallel/context_parallel_collectives.h"
#include "dstrain/parallel/deadline.h"
#include "dstrain/parallel/tensor_parallel_collectives.h"
#include "dstrain/pipeline/partition.h"

namespace dstrain {

namespace {

NamedTensors of_every_chunk(const std::vector<CausalLM>& chunks, NamedTensors (*named)(const torch::nn::Module&)) {
  NamedTensors params;
  for (const CausalLM& chunk : chunks) {
    NamedTensors mine = named(*chunk);
    params.insert(params.end(), mine.begin(), mine.end());
  }
  std::sort(params.begin(), params.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return params;
}

}  // namespace

NamedTensors RankStage::parameters() const { return of_every_chunk(chunks(), sorted_parameters); }

NamedTensors RankStage::module_parameters() const { return of_every_chunk(chunks(), dstrain::module_parameters); }

int64_t RankStage::first_expert(const ModelConfig& config) const {
  return expert_exchange ? expert_exchange->shard().first(config.n_routed_experts) : 0;
}

std::string RankStage::layers_per_virtual_stage() const {
  std::string text;
  for (const LayerSlice& slice : slices) text += (text.empty() ? "" : ",") + std::to_string(slice.last - slice.first);
  return text;
}

namespace {

// parallel.dualpipe_overlap asked for: whether DualPipeV's pairs can run side by side here, and
// if not, why (a warning: the pairs then run one after the other).
bool pairs_side_by_side(const TrainConfig& c, const LaneGroups& expert_groups, const torch::Device& device) {
  std::string why_not;
  if (c.pipeline.schedule != ScheduleKind::kDualPipeV)
    why_not = std::string("the schedule is ") + schedule_name(c.pipeline.schedule) + ", not dualpipev";
  else if (expert_groups.main()->size() == 1)
    why_not = "without expert parallelism (parallel.ep = 1) there is no exchange to hide";
  else if (device.is_cuda())  // both lanes would queue on one stream
    why_not = "on GPUs the pairs run one after the other";
  else if (!expert_groups.has_side())
    why_not = "it needs the MPI backend with MPI_THREAD_MULTIPLE";
  if (!why_not.empty()) log::warning("parallel.dualpipe_overlap is ignored: ", why_not);
  return why_not.empty();
}

// train.recompute_layers counts from each chunk's first decoder layer, the chunk holding the head
// counting its multi-token prediction modules' after its own: a count that no chunk reaches
// recomputes every layer, as 0 does, which the run says rather than leave it to be guessed.
void say_when_every_layer_reruns(const TrainConfig& c, const std::vector<LayerSlice>& slices) {
  if (c.loop.recompute != Recompute::kFull || c.loop.recompute_layers == 0) return;
  int64_t most = 0;
  for (const LayerSlice& slice : slices)
    most = std::max(most, slice.last - slice.first + (slice.has_head ? c.model.num_nextn_predict_layers : 0));
  if (c.loop.recompute_layers >= most)
    log::info("train.recompute_layers = ", c.loop.recompute_layers, ": no model chunk has more than ", most,
              " decoder layers (multi-token prediction modules' included), so every layer is recomputed, as with 0");
}

}  // namespace

ComputeOptions compute_options(const LoopConfig& loop) {
  ComputeOptions options;
  options.recompute = {loop.recompute, loop.recompute_layers};
  options.cuda_kernels = loop.cuda_kernels && cuda_kernels_built();
  options.fp8 = loop.fp8;
  if (loop.grouped_experts && grouped_matmul_built()) options.grouped_matmul = std::make_shared<GroupedMatmul>();
  if (loop.fp8 != Fp8Recipe::kNone && fp8_matmul_built()) options.fp8_matmul = std::make_shared<Fp8Matmul>();
  return options;
}

RankStage build_rank_stage(const TrainConfig& c, ParallelContext& parallel, const torch::Device& device,
                           Initialization initialization) {
  // Initialised in fp32 on the CPU from (seed, name) alone, then moved and rounded: the same
  // start on every device and layout.
  const torch::ScalarType dtype = c.loop.precision;
  if (dtype == torch::kFloat16 && !device.is_cuda())
    throw config_error("train.precision", "fp16",
                       "LibTorch's CPU kernels have no fp16 matrix products; use bf16 on the CPU (fp16 runs on GPUs)");
  Communicator& stages = parallel.group(Group::kPp);
  const int pp = stages.size(), chunks_per_stage = c.pipeline.virtual_stages, stage = stages.rank();
  RankStage rank;
  rank.slices = partition_layers(c.model, c.loop.seq_len, pp * chunks_per_stage, c.pipeline.stage_layers);
  say_when_every_layer_reruns(c, rank.slices);
  ComputeOptions options = compute_options(c.loop);
  rank.rerun_clock = std::make_unique<RerunClock>();
  options.rerun_clock = rank.rerun_clock.get();
  rank.weight_gradients = std::make_unique<WeightGradientStore>();
  options.deferral = rank.weight_gradients.get();
  const LaneGroups expert_groups = parallel.expert_lanes();
  if (expert_groups.main()->size() > 1) {
    rank.expert_exchange = std::make_unique<ExpertAllToAll>(expert_groups, c.loop.fp8 == Fp8Recipe::kBlockwise);
    options.expert_exchange = rank.expert_exchange.get();
  }
  Communicator& tp = parallel.group(Group::kTp);
  if (tp.size() > 1) {
    rank.tensor_parallel = std::make_unique<TensorParallelCollectives>(tp);
    options.tensor_parallel = rank.tensor_parallel.get();
    options.sequence_parallel = c.parallel.sequence_parallel;
  }
  Communicator& cp = parallel.group(Group::kCp);
  if (cp.size() > 1) {
    rank.context_parallel = std::make_unique<ContextParallelCollectives>(cp);
    options.context_parallel = rank.context_parallel.get();
    options.context_parallel_latent = c.parallel.cp_latent;
  }
  const ScheduleKind schedule = c.pipeline.schedule;
  const int microbatches = static_cast<int>(c.loop.grad_accum);
  Schedule training = make_schedule(schedule, pp, chunks_per_stage, microbatches);
  std::vector<CausalLM> chunks;
  for (int chunk = 0; chunk < chunks_per_stage; ++chunk) {
    CausalLM model(c.model, rank.slices[training.virtual_stage(stage, chunk)], options);
    if (initialization == Initialization::kFromSeed)
      initialize_parameters(*model, c.model, c.run.seed, options.tensor_parallel);
    model->to(device);
    cast_parameters(*model, dtype);
    chunks.push_back(model);
  }
  rank.model = std::make_unique<LanguageModelStage>(std::move(chunks), pp * chunks_per_stage);
  Schedule evaluation = make_schedule(ScheduleKind::kForwardOnly, pp, chunks_per_stage, microbatches, training.v_shape);
  {
    // Collective over the stages when the schedule has channels (pipeline/channels.h).
    Deadline deadline("the set-up of the pipeline's channels", c.comm.timeout_s, Deadline::kStartup,
                      ExitCode::kCommunication);
    rank.executor = std::make_unique<PipelineExecutor>(
        std::move(training), std::move(evaluation), stage, *rank.model, *rank.weight_gradients, stages,
        ActivationShape{c.loop.micro_batch, c.loop.seq_len, dtype, device,
                        c.loop.seq_len / cp.size() / (c.parallel.sequence_parallel ? tp.size() : 1)});
  }
  if (c.pipeline.dualpipe_overlap) rank.executor->set_pairs_side_by_side(pairs_side_by_side(c, expert_groups, device));
  return rank;
}

TensorParallelPlacement tensor_parallel_placement(const ParallelContext& parallel) {
  const Communicator& tp = parallel.group(Group::kTp);
  if (tp.size() == 1) return {};
  TensorParallelPlacement placement;
  const int64_t index = tp.rank(), parts = tp.size();
  placement.part = [index, parts](const std::string& name) {
    return TensorPart{tensor_parallel_dim(name), index, parts};
  };
  placement.writes_whole = tp.rank() == 0;
  placement.writes_replicated_parts = parallel.group(Group::kDpCp).rank() == 0;
  return placement;
}

PipelineExecutor::BatchSource step_batches(DataLoader& loader, int64_t micro_batches, const torch::Device& device) {
  auto batches = std::make_shared<std::vector<torch::Tensor>>();
  return [&loader, micro_batches, device, batches](int microbatch) {
    if (batches->empty())
      for (int64_t i = 0; i < micro_batches; ++i) batches->push_back(loader.next().to(device, /*non_blocking=*/true));
    return batches->at(static_cast<size_t>(microbatch));
  };
}

LoaderOptions rank_loader_options(const TrainConfig& c, const ParallelContext& parallel, const torch::Device& device) {
  // The data-parallel ranks of a stage read the global batch's shards, one each.
  const Communicator& readers = parallel.group(Group::kDp);
  LoaderOptions options;
  options.seq_len = static_cast<uint64_t>(c.loop.seq_len);
  options.layout = {static_cast<uint64_t>(c.loop.micro_batch), static_cast<uint64_t>(c.loop.grad_accum),
                    static_cast<uint64_t>(readers.size()), static_cast<uint64_t>(readers.rank())};
  options.seed = c.run.seed;
  options.model_vocab = static_cast<uint64_t>(c.model.vocab_size);
  options.prefetch_depth = static_cast<size_t>(c.data.prefetch);
  options.pinned_for_gpu = device.is_cuda() ? device.index() : -1;
  return options;
}

}  // namespace dstrain
