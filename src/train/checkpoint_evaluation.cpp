#include "dstrain/train/checkpoint_evaluation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/data/corpus.h"
#include "dstrain/data/tokenizer.h"
#include "dstrain/dist/device.h"
#include "dstrain/dist/mpi_check.h"
#include "dstrain/dist/parallel_context.h"
#include "dstrain/model/cuda_kernels.h"
#include "dstrain/model/transformer.h"
#include "dstrain/pipeline/executor.h"
#include "dstrain/pipeline/partition.h"
#include "dstrain/train/agreed_phase.h"
#include "dstrain/train/checkpoint_model.h"
#include "dstrain/train/checkpointing.h"
#include "dstrain/train/evaluation.h"
#include "dstrain/train/train_config.h"

namespace dstrain {
namespace {

}  // namespace

CheckpointEvaluation evaluate_checkpoint(Options options, const std::string& checkpoint, const std::string& corpus_path,
                                         int64_t batches) {
  const auto start = std::chrono::steady_clock::now();
  int world_size = 1, world_rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  TrainConfig c;
  std::unique_ptr<CheckpointReader> reader;
  std::shared_ptr<const CorpusReader> corpus;
  agreed_phase(world_rank, [&] {
    c = read_train_config(options, world_size);
    reader = std::make_unique<CheckpointReader>(checkpoint);
    if (reader->state().model_shape != model_shape_text(c.model))
      throw Error(ExitCode::kCheckpoint, checkpoint + ": the checkpoint's model differs from the configured one (" +
                                             "a --model.* override changes its shape?)");
    corpus = std::make_shared<CorpusReader>(corpus_path);
    if (corpus->info().vocab_size > static_cast<uint64_t>(c.model.vocab_size))
      throw data_error(corpus_path + ": vocabulary " + std::to_string(corpus->info().vocab_size) +
                       " is larger than the model's (" + std::to_string(c.model.vocab_size) + ")");
    // Token ids of another tokenizer mean other text: the loss would measure nothing. (Where a
    // name does not fix the ids, an imported corpus's, there is nothing to compare.)
    const std::string trained_on = tokenizer_identity(reader->state().tokenizer);
    const std::string evaluated_on = tokenizer_identity(corpus->info().tokenizer);
    if (!trained_on.empty() && !evaluated_on.empty() && evaluated_on != trained_on)
      throw data_error(corpus_path + ": tokenized with " + corpus->info().tokenizer + ", the model was trained on " +
                       reader->state().tokenizer + " tokens");
    const int64_t available = global_batches_in(*corpus, c.loop.seq_len, c.loop.global_batch);
    if (available == 0)
      throw data_error(corpus_path + ": too small for one global batch of " + std::to_string(c.loop.global_batch) +
                       " sequences of " + std::to_string(c.loop.seq_len + 1) + " tokens");
    if (batches > available)
      throw Error(ExitCode::kUsage, "--batches " + std::to_string(batches) + ": " + corpus_path + " holds only " +
                                        std::to_string(available) + " global batches of " +
                                        std::to_string(c.loop.global_batch) + " sequences");
    if (batches == 0) batches = available;
  });
  torch::set_num_threads(c.loop.threads);
  enable_cuda_kernels(c.loop.cuda_kernels);
  DevicePlacement placement;
  std::string backend;
  agreed_phase(world_rank, [&] {
    placement = place_rank(c.loop.device);
    backend = resolve_backend(c.comm.backend, placement.device);
  });
  ParallelContext parallel = ParallelContext::create(
      RankGrid(world_size, c.parallel.dp, c.parallel.pp, c.parallel.order), backend, placement.device, c.comm.timeout_s);

  // This stage's chunks of the model, as training would hold them on this layout.
  const int pp = parallel.grid.pp(), chunks_per_stage = c.parallel.virtual_stages, stage = parallel.coord.pp;
  const std::vector<LayerSlice> slices =
      partition_layers(c.model, c.loop.seq_len, pp * chunks_per_stage, c.parallel.stage_layers);
  const torch::ScalarType dtype = dtype_named(c.loop.precision);
  std::vector<CausalLM> chunks;
  NamedTensors params;
  for (int chunk = 0; chunk < chunks_per_stage; ++chunk) {
    CausalLM model(c.model, slices[chunk * pp + stage]);
    model->to(placement.device);
    cast_parameters(*model, dtype);  // as training holds them
    for (auto& named : sorted_parameters(*model)) params.push_back(named);
    chunks.push_back(model);
  }
  // This stage's tensors only: a damaged one is found by this rank alone.
  agreed_phase(world_rank, [&] { load_model_parameters(*reader, params); });
  const int microbatches = static_cast<int>(c.loop.grad_accum);
  const ScheduleKind kind = schedule_kind_named(c.parallel.schedule);
  PipelineExecutor executor(make_schedule(kind, pp, chunks_per_stage, microbatches),
                            make_schedule(ScheduleKind::kForwardOnly, pp, chunks_per_stage, microbatches), stage, chunks,
                            *parallel.pp_group,
                            ActivationShape{c.loop.micro_batch, c.loop.seq_len, dtype, placement.device});
  LoaderOptions loader;
  loader.seq_len = static_cast<uint64_t>(c.loop.seq_len);
  loader.layout = {static_cast<uint64_t>(c.loop.micro_batch), static_cast<uint64_t>(c.loop.grad_accum),
                   static_cast<uint64_t>(parallel.grid.dp()), static_cast<uint64_t>(parallel.coord.dp)};
  loader.seed = c.run.seed;
  loader.model_vocab = static_cast<uint64_t>(c.model.vocab_size);
  loader.prefetch_depth = static_cast<size_t>(c.data.prefetch);
  loader.pinned_for_gpu = placement.device.is_cuda() ? placement.device.index() : -1;

  CheckpointEvaluation result;
  try {
    result.loss = evaluate_loss(executor, corpus, loader, batches, parallel, placement.device);
  } catch (const std::exception& e) {
    // An error now (a bad token in the corpus, a timeout) is this rank's alone and the others
    // are inside collectives: say what happened and end the job, as training does.
    if (world_size == 1) throw;
    const Error* error = dynamic_cast<const Error*>(&e);
    log::error(e.what());
    MPI_Abort(MPI_COMM_WORLD, static_cast<int>(error ? error->code() : ExitCode::kInternal));
    throw;
  }
  result.perplexity = std::exp(result.loss);
  result.checkpoint = reader->path();
  result.corpus = corpus_path;
  result.step = reader->state().step;
  result.batches = batches;
  result.sequences = batches * c.loop.global_batch;
  result.tokens = result.sequences * c.loop.seq_len;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace dstrain
