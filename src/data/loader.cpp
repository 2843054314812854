#include "dstrain/data/loader.h"

#include <vector>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/error.h"

namespace dstrain {

uint64_t samples_in_corpus(uint64_t n_tokens, uint64_t seq_len) {
  return n_tokens > seq_len ? (n_tokens - 1) / seq_len : 0;
}

namespace {

std::vector<uint64_t> samples_per_corpus(const Mixture& mixture, uint64_t seq_len) {
  std::vector<uint64_t> samples;
  for (const auto& corpus : mixture.corpora) samples.push_back(samples_in_corpus(corpus->info().n_tokens, seq_len));
  return samples;
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const CorpusReader> corpus, const LoaderOptions& options,
                       uint64_t start_sample)
    : DataLoader(Mixture{{std::move(corpus)}, {1.0}}, options, start_sample) {}

DataLoader::DataLoader(const Mixture& mixture, const LoaderOptions& options, uint64_t start_sample)
    : mixture_(mixture),
      options_(options),
      sampler_(samples_per_corpus(mixture, options.seq_len), mixture.weights, options.seed, options.shuffle),
      consumed_(start_sample) {
  const uint64_t global_batch = options_.layout.global_batch();
  const std::vector<uint64_t> samples = samples_per_corpus(mixture_, options_.seq_len);
  for (size_t c = 0; c < samples.size(); ++c) {
    const CorpusInfo& info = mixture_.corpora[c]->info();
    // One corpus must fill a global batch; in a mixture each must hold a sample (it repeats).
    const uint64_t needed = samples.size() == 1 ? global_batch : 1;
    if (samples[c] < needed)
      throw data_error(info.path + ": " + std::to_string(info.n_tokens) + " tokens make " + std::to_string(samples[c]) +
                       " samples of " + std::to_string(options_.seq_len + 1) + " tokens, fewer than " +
                       (samples.size() == 1 ? "one global batch (" + std::to_string(global_batch) + " samples)"
                                            : std::string("one")));
  }
  thread_ = std::thread([this] { prefetch_loop(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t DataLoader::global_batch_after(uint64_t consumed) const {
  return options_.global_batch_after ? options_.global_batch_after(consumed) : options_.layout.global_batch();
}

torch::Tensor DataLoader::read_micro_batch(uint64_t first, uint64_t accum, uint64_t micro) {
  const uint64_t rows = options_.layout.micro_batch, width = options_.seq_len + 1;
  std::vector<uint32_t> tokens(width);
  torch::Tensor batch = torch::empty({static_cast<int64_t>(rows), static_cast<int64_t>(width)},
                                     torch::dtype(torch::kInt64).pinned_memory(options_.pinned_for_gpu >= 0));
  int64_t* out = batch.data_ptr<int64_t>();
  for (uint64_t row = 0; row < rows; ++row) {
    const MixedSampler::Pick pick = sampler_.pick(options_.layout.position_in(first, accum, micro, row));
    const CorpusReader& corpus = *mixture_.corpora[pick.corpus];
    uint64_t offset = pick.sample * options_.seq_len;
    corpus.read(offset, width, tokens.data());
    for (uint64_t i = 0; i < width; ++i) {
      if (tokens[i] >= options_.model_vocab)
        throw data_error(corpus.info().path + ": token " + std::to_string(tokens[i]) +
                         " at offset " + std::to_string(offset + i) +
                         " is outside the model's vocabulary (model.vocab_size = " +
                         std::to_string(options_.model_vocab) + ")");
      out[row * width + i] = tokens[i];
    }
  }
  return batch;
}

void DataLoader::prefetch_loop() {
  const uint64_t per_micro = options_.layout.micro_batch * options_.layout.dp_size;
  uint64_t first = consumed_, accum = global_batch_after(first) / per_micro, micro = 0;
  for (uint64_t produced = 0;; ++produced) {
    torch::Tensor batch;
    try {
      // A new thread's CUDA calls go to GPU 0, and LibTorch's pinned-memory allocator makes some
      // (it queries the events of earlier copies): without this, every rank of a node would open
      // a context on GPU 0, ~0.5 GiB each.
      if (produced == 0 && options_.pinned_for_gpu >= 0) accel::set_current_device(options_.pinned_for_gpu);
      batch = read_micro_batch(first, accum, micro);
      if (++micro == accum) {  // on to the next step, whose batch follows from the samples before it
        first += accum * per_micro;
        accum = global_batch_after(first) / per_micro;
        micro = 0;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return stopping_ || ready_.size() < options_.prefetch_depth; });
    if (stopping_) return;
    ready_.push_back(std::move(batch));
    changed_.notify_all();
  }
}

torch::Tensor DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || failure_; });
  if (ready_.empty()) std::rethrow_exception(failure_);
  torch::Tensor batch = std::move(ready_.front());
  ready_.pop_front();
  const uint64_t step_batch = global_batch_after(consumed_);
  if (++taken_in_step_ * options_.layout.micro_batch * options_.layout.dp_size == step_batch) {
    consumed_ += step_batch;
    taken_in_step_ = 0;
  }
  changed_.notify_all();
  return batch;
}

uint64_t DataLoader::consumed_samples() const { return consumed_; }

}  // namespace dstrain
