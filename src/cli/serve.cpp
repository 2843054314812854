#include "serve.h"

#include <cstdio>
#include <iostream>

#include "command_args.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/model/generation.h"
#include "dstrain/serve/batch_engine.h"
#include "dstrain/serve/completion_service.h"
#include "dstrain/serve/http_server.h"
#include "inference_model.h"

namespace dstrain {
namespace {

const char* kServeUsage =
    "usage: dstrain serve --ckpt CKPT [options] [--model.key value ...]\n"
    "\n"
    "Serves the model of checkpoint CKPT (a file, or a checkpoint directory: its latest), written by any\n"
    "layout or imported from Hugging Face, over HTTP with OpenAI's completions API, on one process (GPU 0\n"
    "when there is one). Requests in flight decode as one batch, a request arriving joins it at the next\n"
    "token. SIGTERM or SIGINT: no new requests, those in flight finish, exit 0.\n"
    "\n"
    "  POST /v1/completions   prompt (text, token ids, or a list of either), max_tokens, temperature, top_p,\n"
    "                         top_k, stop, seed, stream, echo, logprobs\n"
    "  GET  /v1/models        the model's name, step and shape\n"
    "  GET  /health\n"
    "\n"
    "  --ckpt CKPT             checkpoint file or directory\n"
    "  --host ADDRESS          address to listen on (127.0.0.1: this machine only)\n"
    "  --port PORT             port to listen on (8000; 0: any free one, printed at start)\n"
    "  --tokenizer NAME        the tokenizer of the model's corpus: byte (the default), or its tokenizer.json\n"
    "  --device D              cpu, cuda (GPU 0) or auto (the default)\n"
    "  --max-batch N           completions decoding together (8)\n"
    "  --max-queue N           completions waiting for a place in the batch (64); more get 503\n"
    "  --max-tokens-limit N    the most max_tokens a request may ask for (1024)\n"
    "  --body-limit BYTES      the largest request body (1048576); larger ones get 413\n"
    "  --model-name NAME       the model's id in /v1/models and responses (the run's directory name)\n";

nlohmann::json model_details(const InferenceModel& loaded) {
  const ModelConfig& c = loaded.model->config();
  int64_t parameters = 0;
  for (const torch::Tensor& p : loaded.model->parameters()) parameters += p.numel();
  return {{"checkpoint", loaded.checkpoint}, {"step", loaded.step},        {"max_model_len", c.max_seq_len},
          {"parameters", parameters},        {"layers", c.num_layers},      {"hidden_size", c.hidden_size},
          {"vocab_size", c.vocab_size},      {"tokenizer", loaded.tokenizer->name()}};
}

}  // namespace

int serve_command(const std::vector<std::string>& args) {
  const CommandArgs parsed = split_command_args(
      args,
      {"ckpt", "host", "port", "tokenizer", "device", "max-batch", "max-queue", "max-tokens-limit", "body-limit",
       "model-name"},
      "serve");
  if (parsed.help) {
    std::cout << kServeUsage;
    return 0;
  }
  if (!parsed.own.count("ckpt")) throw Error(ExitCode::kUsage, "serve: give --ckpt (see dstrain serve --help)");
  HttpOptions http;
  http.host = parsed.own.count("host") ? parsed.own.at("host") : "127.0.0.1";
  http.port = static_cast<uint16_t>(number_option(parsed, "port", 8000, 0, 65535, true));
  http.body_limit = static_cast<size_t>(number_option(parsed, "body-limit", 1 << 20, 1024, 1e9, true));
  EngineLimits engine_limits;
  engine_limits.max_batch = static_cast<int64_t>(number_option(parsed, "max-batch", 8, 1, 4096, true));
  engine_limits.max_queue = static_cast<int64_t>(number_option(parsed, "max-queue", 64, 1, 1e6, true));
  const auto max_tokens_limit = static_cast<int64_t>(number_option(parsed, "max-tokens-limit", 1024, 1, 1e9, true));

  // Bound first: a port in use fails at once, and clients that connect meanwhile wait for the model.
  std::unique_ptr<CompletionService> service;
  HttpServer server(http, [&service](const HttpRequest& request, std::shared_ptr<HttpExchange> exchange) {
    service->handle(request, exchange);
  });
  const InferenceModel loaded = load_inference_model(parsed, "serve");
  const CachedDecoder decoder(loaded.model);
  const std::string name = parsed.own.count("model-name") ? parsed.own.at("model-name") : loaded.run_name;
  RequestLimits request_limits;
  request_limits.context = loaded.model->config().max_seq_len;
  request_limits.vocab_size = loaded.tokenizer->vocab_size();
  request_limits.max_tokens_limit = max_tokens_limit;
  BatchEngine engine(decoder, *loaded.tokenizer, engine_limits);
  service = std::make_unique<CompletionService>(engine, *loaded.tokenizer, ModelCard{name, model_details(loaded)},
                                                request_limits);
  std::fprintf(stderr, "serving %s (step %lld) as \"%s\" on http://%s:%u on %s, batches of up to %lld\n",
               loaded.checkpoint.c_str(), static_cast<long long>(loaded.step), name.c_str(), http.host.c_str(),
               static_cast<unsigned>(server.port()), loaded.device.str().c_str(),
               static_cast<long long>(engine_limits.max_batch));
  std::fflush(stderr);
  server.run();
  std::fprintf(stderr, "serve: drained, exiting\n");
  return 0;  // the engine completes what it holds as it goes
}

}  // namespace dstrain
