#include "dstrain/serve/batch_engine.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

namespace dstrain {

struct BatchEngine::Row {
  std::shared_ptr<CompletionJob> job;
  at::Generator generator;
  int64_t position = 0;  // positions the row's cache holds
  torch::Tensor logits;  // [vocab]: the next token's
  CompletionText text;
  size_t prompt_characters = 0;
  int64_t generated = 0;
  int64_t last_token = 0;                                // the one sampled last: the next step's input
  size_t given_out = 0;                                  // bytes of text handed to on_piece
  std::deque<std::pair<size_t, TokenLogprob>> waiting;  // tokens not handed out, by their first byte
};

BatchEngine::BatchEngine(const CachedDecoder& decoder, const Tokenizer& tokenizer, EngineLimits limits)
    : decoder_(decoder),
      tokenizer_(tokenizer),
      limits_(limits),
      cache_(decoder.empty_cache(limits.max_batch)),
      rows_(static_cast<size_t>(limits.max_batch)) {
  thread_ = std::thread([this] { run(); });
}

BatchEngine::~BatchEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool BatchEngine::submit(const std::vector<std::shared_ptr<CompletionJob>>& jobs, const std::function<void()>& queued) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (static_cast<int64_t>(queue_.size() + jobs.size()) > limits_.max_queue) return false;
    queue_.insert(queue_.end(), jobs.begin(), jobs.end());
    if (queued) queued();
  }
  wake_.notify_all();
  return true;
}

int64_t BatchEngine::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(queue_.size()) + decoding_.load();
}

void BatchEngine::run() {
  for (;;) {
    std::vector<std::pair<std::shared_ptr<CompletionJob>, size_t>> arrivals;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty() || decoding_ > 0; });
      if (stopping_ && queue_.empty() && decoding_ == 0) return;
      // Arrivals take the lowest free rows: the batch decodes rows 0 .. the highest one busy.
      for (size_t row = 0; row < rows_.size() && !queue_.empty(); ++row) {
        if (rows_[row]) continue;
        std::shared_ptr<CompletionJob> job = std::move(queue_.front());
        queue_.pop_front();
        if (job->cancelled) {  // its client left while it waited
          ++cancelled_;
          continue;
        }
        rows_[row] = std::make_unique<Row>();  // taken; its prompt is read below, outside the lock
        rows_[row]->job = job;
        arrivals.emplace_back(std::move(job), row);
        ++decoding_;
      }
    }
    try {
      for (auto& [job, row] : arrivals) admit(job, row);
      for (size_t row = 0; row < rows_.size(); ++row) {
        if (!rows_[row]) continue;
        if (rows_[row]->job->cancelled) {  // its client has gone
          release(row);
          ++cancelled_;  // (after: whoever sees the count sees the row free)
        } else if (const std::optional<std::string> reason = advance(*rows_[row])) {
          finish(row, *reason);
        }
      }
      decode_continuing_rows();
    } catch (const std::exception& e) {
      // The model failed (out of memory, ...): the completions in flight end with the error; the
      // engine goes on with the next requests.
      CompletionEnd end;
      end.error = e.what();
      for (size_t row = 0; row < rows_.size(); ++row)
        if (rows_[row]) {
          if (!rows_[row]->job->cancelled) rows_[row]->job->on_end(end);
          release(row);
        }
    }
  }
}

void BatchEngine::admit(const std::shared_ptr<CompletionJob>& job, size_t index) {
  Row& row = *rows_[index];
  row.generator = at::make_generator<at::CPUGeneratorImpl>(job->sampling.seed);
  row.text = CompletionText(job->stop);
  const int64_t n = static_cast<int64_t>(job->prompt.size());
  KvCache cache = cache_row(cache_, static_cast<int64_t>(index));
  const torch::Tensor ids = torch::tensor(job->prompt, torch::kLong).unsqueeze(0).to(decoder_.forward_device());
  const torch::Tensor logits = decoder_.forward(ids, cache)[0];  // [n, vocab]
  row.logits = logits[n - 1];
  row.position = n;
  CompletionPiece echoed;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t token = job->prompt[static_cast<size_t>(i)];
    const std::string text = text_of(token);
    if (job->echo && job->logprobs >= 0) {
      TokenLogprob position = i > 0 ? logprob_of(logits[i - 1], token, job->logprobs) : TokenLogprob{};
      position.text = text;
      position.text_offset = row.prompt_characters;
      echoed.tokens.push_back(std::move(position));
    }
    echoed.text += text;
    row.prompt_characters += utf8_characters(text);
  }
  if (job->echo) job->on_piece(std::move(echoed));
}

std::optional<std::string> BatchEngine::advance(Row& row) {
  const CompletionJob& job = *row.job;
  if (row.generated >= job.sampling.max_new_tokens) return "length";  // max_tokens 0: the prompt alone
  const int64_t token = sample_token(row.logits, job.sampling, row.generator);
  ++row.generated;
  row.last_token = token;
  if (token == job.sampling.stop_token) return "stop";  // the end of document: no text
  const size_t start = row.text.text().size();
  TokenLogprob position = job.logprobs >= 0 ? logprob_of(row.logits, token, job.logprobs) : TokenLogprob{};
  position.text = text_of(token);
  position.text_offset = row.prompt_characters + utf8_characters(row.text.text());
  const bool stopped = row.text.append(position.text);
  if (job.logprobs >= 0) row.waiting.emplace_back(start, std::move(position));
  if (stopped) return "stop";
  if (row.generated >= job.sampling.max_new_tokens || row.position >= decoder_.config().max_seq_len) return "length";
  give_out_settled(row, /*all=*/false);
  return std::nullopt;
}

void BatchEngine::decode_continuing_rows() {
  size_t busy = 0;  // rows 0 .. busy - 1 decode; free rows among them decode a token nobody reads
  for (size_t row = 0; row < rows_.size(); ++row)
    if (rows_[row]) busy = row + 1;
  if (busy == 0) return;
  std::vector<int64_t> tokens(busy, 0), positions(busy, 0);
  for (size_t row = 0; row < busy; ++row)
    if (rows_[row]) {
      tokens[row] = rows_[row]->last_token;
      positions[row] = rows_[row]->position;
    }
  const torch::Tensor ids = torch::tensor(tokens, torch::kLong).unsqueeze(1).to(decoder_.forward_device());
  const torch::Tensor logits = decoder_.decode(ids, cache_, positions);  // [busy, 1, vocab]
  for (size_t row = 0; row < busy; ++row)
    if (rows_[row]) {
      rows_[row]->logits = logits[static_cast<int64_t>(row)][0];
      ++rows_[row]->position;
    }
}

void BatchEngine::finish(size_t index, const std::string& reason) {
  Row& row = *rows_[index];
  give_out_settled(row, /*all=*/true);
  CompletionEnd end;
  end.finish_reason = reason;
  end.prompt_tokens = static_cast<int64_t>(row.job->prompt.size());
  end.completion_tokens = row.generated;
  row.job->on_end(end);
  release(index);
}

void BatchEngine::release(size_t row) {
  rows_[row].reset();
  --decoding_;
}

void BatchEngine::give_out_settled(Row& row, bool all) {
  const std::string& text = row.text.text();
  const size_t settled = all ? text.size() : row.text.settled();
  CompletionPiece piece;
  if (settled > row.given_out) {
    piece.text = text.substr(row.given_out, settled - row.given_out);
    row.given_out = settled;
  }
  // A token goes with the piece its text starts in; at the end every token goes, but those a
  // stop string took.
  while (!row.waiting.empty() && (row.waiting.front().first < settled || (all && !row.text.stopped()))) {
    piece.tokens.push_back(std::move(row.waiting.front().second));
    row.waiting.pop_front();
  }
  if (all) row.waiting.clear();
  if (!piece.text.empty() || !piece.tokens.empty()) row.job->on_piece(std::move(piece));
}

TokenLogprob BatchEngine::logprob_of(const torch::Tensor& logits, int64_t token, int64_t alternatives) const {
  const torch::Tensor logprobs = torch::log_softmax(logits.detach().to(torch::kCPU, torch::kFloat32), -1);
  TokenLogprob out;
  out.logprob = logprobs[token].item<double>();
  if (alternatives > 0) {
    const auto [values, ids] = logprobs.topk(std::min<int64_t>(alternatives, logprobs.size(0)));
    for (int64_t i = 0; i < values.size(0); ++i)
      out.top.emplace_back(text_of(ids[i].item<int64_t>()), values[i].item<double>());
  }
  return out;
}

std::string BatchEngine::text_of(int64_t token) const {
  // A token the tokenizer does not know (the model's vocabulary may be padded past it) has no text.
  if (token < 0 || token >= static_cast<int64_t>(tokenizer_.vocab_size())) return "";
  return tokenizer_.decode({static_cast<uint32_t>(token)});
}

}  // namespace dstrain
