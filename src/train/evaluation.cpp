#include "dstrain/train/evaluation.h"

#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/train/stage_builder.h"

namespace dstrain {

double evaluate_loss(PipelineExecutor& executor, const std::shared_ptr<const CorpusReader>& corpus,
                     LoaderOptions options, int64_t batches, ParallelContext& parallel, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const int64_t grad_accum = static_cast<int64_t>(options.layout.grad_accum);
  std::unique_ptr<DataLoader> loader;
  if (executor.needs_batches()) {
    options.shuffle = false;  // the same sequences every time, whatever the step
    loader = std::make_unique<DataLoader>(corpus, options, /*start_step=*/0);
  }
  torch::Tensor total = torch::zeros({1}, torch::dtype(torch::kFloat64).device(device));
  for (int64_t b = 0; b < batches; ++b) {
    // A stage that needs no tokens never asks for them.
    total += executor.evaluate(loader ? step_batches(*loader, grad_accum, device) : PipelineExecutor::BatchSource());
  }
  // The losses are on the last stage: the sum over the stages brings them to every stage.
  parallel.group(Group::kPp).all_reduce(total, ReduceOp::kSum);
  torch::Tensor mean = total / static_cast<double>(batches * grad_accum);
  // The mean over the ranks that read other data.
  Communicator& readers = parallel.group(Group::kDpCp);
  readers.all_reduce(mean, ReduceOp::kAvg);
  readers.synchronize();
  return mean.item<double>();
}

int64_t global_batches_in(const CorpusReader& corpus, int64_t seq_len, int64_t global_batch) {
  return static_cast<int64_t>(samples_in_corpus(corpus.info().n_tokens, static_cast<uint64_t>(seq_len)) /
                              static_cast<uint64_t>(global_batch));
}

Validator::Validator(const TrainConfig& c, std::shared_ptr<const CorpusReader> corpus, PipelineExecutor& executor,
                     LoaderOptions options, ParallelContext& parallel, const torch::Device& device)
    : corpus_(std::move(corpus)), executor_(executor), options_(options), parallel_(parallel), device_(device),
      interval_(c.loop.eval_interval), last_step_(c.loop.steps), batches_(c.loop.eval_batches) {
  if (!corpus_) return;
  const int64_t available = global_batches_in(*corpus_, c.loop.seq_len, c.loop.global_batch);
  if (available == 0)
    throw data_error(c.data.valid + ": too small for one global batch of " + std::to_string(c.loop.global_batch) +
                     " sequences of " + std::to_string(c.loop.seq_len + 1) + " tokens");
  if (available < batches_) {
    log::warning("train.eval_batches = ", batches_, ": ", c.data.valid, " holds only ", available,
                 " global batches; evaluating on those");
    batches_ = available;
  }
}

bool Validator::due(int64_t step) const {
  return corpus_ && ((interval_ > 0 && step % interval_ == 0) || step == last_step_);
}

double Validator::evaluate() { return evaluate_loss(executor_, corpus_, options_, batches_, parallel_, device_); }

}  // namespace dstrain
