// A request to POST /v1/completions (OpenAI's legacy completions API, which evaluation harnesses
// score with), parsed and checked once into types. Anything wrong becomes one RequestError naming
// the field, which the endpoint answers with an OpenAI-style JSON error.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dstrain/data/tokenizer.h"

namespace dstrain {

// What a request may ask for: the model's and the server's bounds.
struct RequestLimits {
  int64_t context = 0;           // model.max_seq_len: prompt and completion together
  int64_t vocab_size = 0;        // token ids a prompt may hold: the tokenizer's
  int64_t max_tokens_limit = 0;  // --max-tokens-limit
  int64_t max_logprobs = 20;
};

struct RequestError : std::runtime_error {
  RequestError(int status, const std::string& param, const std::string& message)
      : std::runtime_error(message), status(status), param(param) {}
  int status;         // 400, 404, 413, 503, ...
  std::string param;  // the field at fault ("" for the request as a whole)
};

struct CompletionRequest {
  std::vector<std::vector<int64_t>> prompts;  // token ids, one choice each
  int64_t max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;  // 0: all (-1 too, as vLLM takes it)
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  bool stream = false;
  bool echo = false;
  int64_t logprobs = -1;  // alternatives a position lists; -1: no log-probabilities
  std::string model;
};

// `body`: the request's JSON. String prompts are tokenized as `dstrain generate` tokenizes them
// (the tokenizer's beginning token first, where it has one); token-id prompts are taken as given.
// Fields dstrain does not know are ignored, as OpenAI-compatible servers do. Throws RequestError.
CompletionRequest parse_completion_request(const std::string& body, const Tokenizer& tokenizer,
                                           const RequestLimits& limits);

}  // namespace dstrain
