// Continuous batching over the KV cache: the completions of every request in flight decode as
// one batch, a token each per step, and a request that arrives while others decode joins them at
// the next step, in a free row of the batched cache (CachedDecoder::decode), without waiting for
// the batch to finish. Its prompt is read alone into its row first, as `dstrain generate` reads
// one, so that a request's tokens are those it would get alone (up to the rounding of products of
// another batch size). One thread computes; requests come and results go through callbacks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dstrain/data/tokenizer.h"
#include "dstrain/model/generation.h"
#include "dstrain/serve/completion_text.h"

namespace dstrain {

// One position's log-probabilities under the model (before temperature, top-k and top-p): its
// token's own (none for a prompt's first token) and the most likely tokens there.
struct TokenLogprob {
  std::string text;               // the token's text
  std::optional<double> logprob;  // none: a prompt's first token
  std::vector<std::pair<std::string, double>> top;  // the most likely first
  size_t text_offset = 0;         // characters from the start of the prompt's text
};

// A piece of a completion as it becomes settled: its text, and the positions whose text starts in
// it (with log-probabilities, when asked for).
struct CompletionPiece {
  std::string text;
  std::vector<TokenLogprob> tokens;
};

struct CompletionEnd {
  std::string finish_reason;  // "stop" (end of document, a stop string), "length", or "" on error
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::string error;  // what failed, when the model did
};

// One prompt's completion, the unit the engine batches.
struct CompletionJob {
  std::vector<int64_t> prompt;   // 1 .. context tokens
  SamplingOptions sampling;      // max_new_tokens may be 0 (echo alone); stop_token: end of document
  std::vector<std::string> stop;
  bool echo = false;             // the prompt's text (and log-probabilities) come first
  int64_t logprobs = -1;         // alternatives listed a position; -1: no log-probabilities
  // Called on the engine's thread, pieces in order, then the end once.
  std::function<void(CompletionPiece)> on_piece;
  std::function<void(const CompletionEnd&)> on_end;
  std::atomic<bool> cancelled{false};  // set by a client gone: the job's row is freed, nothing more is called
};

struct EngineLimits {
  int64_t max_batch = 8;   // rows decoding together
  int64_t max_queue = 64;  // completions waiting for a row
};

class BatchEngine {
 public:
  BatchEngine(const CachedDecoder& decoder, const Tokenizer& tokenizer, EngineLimits limits);
  ~BatchEngine();  // completes every job it holds, then stops
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;
  // Queues the jobs, all or none: false when the queue lacks room for them. `queued` runs once
  // they are queued, before the engine can call any of their callbacks.
  bool submit(const std::vector<std::shared_ptr<CompletionJob>>& jobs, const std::function<void()>& queued = {});
  // Jobs waiting or decoding.
  int64_t pending() const;
  // Jobs ended early because their client went away.
  int64_t cancelled() const { return cancelled_.load(); }

 private:
  struct Row;
  void run();
  void admit(const std::shared_ptr<CompletionJob>& job, size_t row);
  // Samples the row's next token from its logits: why that ends the completion, or nothing.
  std::optional<std::string> advance(Row& row);
  void decode_continuing_rows();
  void finish(size_t row, const std::string& reason);  // gives out the rest, frees the row
  void release(size_t row);
  void give_out_settled(Row& row, bool all);
  TokenLogprob logprob_of(const torch::Tensor& logits, int64_t token, int64_t alternatives) const;
  std::string text_of(int64_t token) const;

  const CachedDecoder& decoder_;
  const Tokenizer& tokenizer_;
  const EngineLimits limits_;
  KvCache cache_;
  std::vector<std::unique_ptr<Row>> rows_;  // max_batch entries, null where free
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<CompletionJob>> queue_;
  std::atomic<int64_t> decoding_{0};
  std::atomic<int64_t> cancelled_{0};
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dstrain
