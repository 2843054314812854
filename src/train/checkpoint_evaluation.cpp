#include "dstrain/train/checkpoint_evaluation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/model_shape.h"
#include "dstrain/core/error.h"
#include "dstrain/data/corpus.h"
#include "dstrain/data/tokenizer.h"
#include "dstrain/parallel/agreed_phase.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/train/evaluation.h"
#include "dstrain/train/job.h"
#include "dstrain/train/stage_builder.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

CheckpointEvaluation evaluate_checkpoint(Options options, const std::string& checkpoint, const std::string& corpus_path,
                                         int64_t batches) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<CheckpointReader> reader;
  std::shared_ptr<const CorpusReader> corpus;
  Job job = start_job([&](int world_size, int) {  // every rank reads the checkpoint and the corpus
    TrainConfig c = read_train_config(options, world_size);
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
    return c;
  });
  const TrainConfig& c = job.config;
  ParallelContext& parallel = *job.parallel;
  // This stage's chunks of the model, as training would hold them on this layout; this stage's
  // tensors only: a damaged one is found by this rank alone.
  const RankStage stage = build_rank_stage(c, parallel, job.placement.device, Initialization::kNone);
  agreed_phase(job.world_rank,
               [&] { load_model_parameters(*reader, stage.parameters(), tensor_parallel_placement(parallel)); });
  const LoaderOptions loader = rank_loader_options(c, parallel, job.placement.device);

  CheckpointEvaluation result;
  // An error now (a bad token in the corpus, a timeout) is this rank's alone.
  result.loss = run_or_abort(
      job, [&] { return evaluate_loss(*stage.executor, corpus, loader, batches, parallel, job.placement.device); });
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
