// This DP rank's micro-batches, read ahead by a background thread.
#pragma once

#include "dstrain/core/torch_api.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "dstrain/data/corpus.h"
#include "dstrain/data/mixture.h"
#include "dstrain/data/sampler.h"

namespace dstrain {

struct LoaderOptions {
  uint64_t seq_len = 0;
  BatchLayout layout{};
  uint64_t seed = 0;
  bool shuffle = true;
  uint64_t model_vocab = 0;   // a token id at or above it is a data error
  size_t prefetch_depth = 4;  // micro-batches read ahead
  // The global batch of a step that starts after a number of samples (a batch-size ramp-up);
  // empty: layout.global_batch() for every step.
  std::function<uint64_t(uint64_t consumed)> global_batch_after;
  int pinned_for_gpu = -1;     // ≥ 0: page-locked batches, for asynchronous copies to this GPU
};

// Number of samples of seq_len + 1 tokens a corpus of n_tokens holds.
uint64_t samples_in_corpus(uint64_t n_tokens, uint64_t seq_len);

class DataLoader {
 public:
  // Starts with the step after `start_sample` samples consumed. Throws Error(kData) when the
  // corpus has fewer samples than one global batch.
  DataLoader(std::shared_ptr<const CorpusReader> corpus, const LoaderOptions& options,
             uint64_t start_sample);
  // Several corpora in proportions (see mixture.h); each must hold at least one sample.
  DataLoader(const Mixture& mixture, const LoaderOptions& options, uint64_t start_sample);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next micro-batch, int64 [micro_batch, seq_len + 1]; step by step, micro-batch by
  // micro-batch. Rethrows a read error of the prefetch thread.
  torch::Tensor next();
  // Global samples consumed by the completed steps: the loader's whole state.
  uint64_t consumed_samples() const;

 private:
  torch::Tensor read_micro_batch(uint64_t first, uint64_t accum, uint64_t micro);
  void prefetch_loop();
  uint64_t global_batch_after(uint64_t consumed) const;

  Mixture mixture_;
  LoaderOptions options_;
  MixedSampler sampler_;  // used by the prefetch thread only
  uint64_t consumed_;           // samples of the steps handed out whole
  uint64_t taken_in_step_ = 0;  // micro-batches handed out of the step after them

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<torch::Tensor> ready_;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dstrain
