#include "dstrain/train/evaluation.h"

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
    std::vector<torch::Tensor> micro_batches;
    auto batch = [&](int microbatch) {
      if (micro_batches.empty())
        for (int64_t i = 0; i < grad_accum; ++i)  // pinned host memory: the copy overlaps the kernels
          micro_batches.push_back(loader->next().to(device, /*non_blocking=*/true));
      return micro_batches[static_cast<size_t>(microbatch)];
    };
    total += executor.evaluate(batch);
  }
  // The losses are on the last stage: the sum over the stages brings them to every stage.
  parallel.pp_group->all_reduce(total, ReduceOp::kSum);
  torch::Tensor mean = total / static_cast<double>(batches * grad_accum);
  parallel.dp_group->all_reduce(mean, ReduceOp::kAvg);
  parallel.dp_group->synchronize();
  return mean.item<double>();
}

int64_t global_batches_in(const CorpusReader& corpus, int64_t seq_len, int64_t global_batch) {
  return static_cast<int64_t>(samples_in_corpus(corpus.info().n_tokens, static_cast<uint64_t>(seq_len)) /
                              static_cast<uint64_t>(global_batch));
}

}  // namespace dstrain
