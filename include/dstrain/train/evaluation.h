// Evaluation: the mean next-token loss of a model over the first global batches of a corpus, in
// corpus order (no shuffling). One function serves both the training loop's eval_loss and
// `dstrain eval`, so that the two agree by construction, whatever the layout.
#pragma once

#include "dstrain/core/torch_api.h"

#include <memory>
#include <string>
#include <vector>

#include "dstrain/data/corpus.h"
#include "dstrain/data/loader.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/pipeline/executor.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

// `options.layout` says which micro-batches this rank reads (its DP rank's share of each global
// batch); `batches` global batches are evaluated. Collective over the PP and DP groups: every rank
// returns the same mean loss.
double evaluate_loss(PipelineExecutor& executor, const std::shared_ptr<const CorpusReader>& corpus,
                     LoaderOptions options, int64_t batches, ParallelContext& parallel, const torch::Device& device);

// Global batches of `global_batch` sequences of seq_len + 1 tokens that a corpus holds.
int64_t global_batches_in(const CorpusReader& corpus, int64_t seq_len, int64_t global_batch);

// The training loop's evaluation on data.valid: every train.eval_interval steps and after the
// last, over its first train.eval_batches global batches (fewer, with a warning, when the corpus
// holds fewer). Throws Error(kData) when the corpus is too small for one global batch.
class Validator {
 public:
  // `corpus`: null without data.valid. `executor` and `parallel` outlive the validator.
  Validator(const TrainConfig& config, std::shared_ptr<const CorpusReader> corpus, PipelineExecutor& executor,
            LoaderOptions options, ParallelContext& parallel, const torch::Device& device);
  bool enabled() const { return corpus_ != nullptr; }
  bool due(int64_t step) const;
  double evaluate();  // collective: the mean loss, the same on every rank

 private:
  std::shared_ptr<const CorpusReader> corpus_;
  PipelineExecutor& executor_;
  LoaderOptions options_;
  ParallelContext& parallel_;
  torch::Device device_;
  int64_t interval_, last_step_, batches_;
};

}  // namespace dstrain
