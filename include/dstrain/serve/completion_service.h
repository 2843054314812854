// The routes of `dstrain serve`: POST /v1/completions (OpenAI's completions, whole or streamed as
// server-sent events), GET /v1/models, GET /health. Requests become jobs of the batch engine;
// their pieces become OpenAI's JSON.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "dstrain/serve/batch_engine.h"
#include "dstrain/serve/completion_request.h"
#include "dstrain/serve/http_server.h"

namespace dstrain {

// What GET /v1/models says of the model.
struct ModelCard {
  std::string name;        // the id clients name it by (any name is answered)
  nlohmann::json details;  // step, shape, checkpoint
};

class CompletionService {
 public:
  CompletionService(BatchEngine& engine, const Tokenizer& tokenizer, ModelCard card, RequestLimits limits);
  void handle(const HttpRequest& request, const std::shared_ptr<HttpExchange>& exchange);

 private:
  void complete(const HttpRequest& request, const std::shared_ptr<HttpExchange>& exchange);
  BatchEngine& engine_;
  const Tokenizer& tokenizer_;
  const ModelCard card_;
  const RequestLimits limits_;
  std::atomic<uint64_t> requests_{0};
};

}  // namespace dstrain
