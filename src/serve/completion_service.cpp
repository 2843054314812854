#include "dstrain/serve/completion_service.h"

#include <ctime>
#include <random>
#include <vector>

namespace dstrain {
namespace {

using nlohmann::json;

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// OpenAI's logprobs object for `tokens`.
json logprobs_json(const std::vector<TokenLogprob>& tokens) {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprob& t : tokens) {
    out["tokens"].push_back(t.text);
    out["text_offset"].push_back(t.text_offset);
    if (!t.logprob) {  // a prompt's first token: nothing before it to predict it from
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      continue;
    }
    out["token_logprobs"].push_back(*t.logprob);
    json top = json::object();
    for (const auto& [text, logprob] : t.top)
      if (!top.contains(text)) top[text] = logprob;  // tokens of the same text: the likelier one
    out["top_logprobs"].push_back(top);
  }
  return out;
}

// One choice as its pieces arrive (a whole response's).
struct Choice {
  std::string text;
  std::vector<TokenLogprob> tokens;
  CompletionEnd end;
};

// What every choice of one request shares: the response's identity and the count of those open.
struct Completion {
  std::string id, model;
  int64_t created = 0;
  bool logprobs = false;
  std::vector<Choice> choices;
  size_t open = 0;
  std::string error;
  std::vector<std::shared_ptr<CompletionJob>> jobs;

  json usage() const {
    int64_t prompt = 0, completion = 0;
    for (const Choice& c : choices) prompt += c.end.prompt_tokens, completion += c.end.completion_tokens;
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  }
  json frame(json choices_json) const {
    return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}, {"choices", choices_json}};
  }
  json whole() const {
    json list = json::array();
    for (size_t i = 0; i < choices.size(); ++i)
      list.push_back({{"index", i},
                      {"text", choices[i].text},
                      {"logprobs", logprobs ? logprobs_json(choices[i].tokens) : json(nullptr)},
                      {"finish_reason", choices[i].end.finish_reason}});
    json out = frame(list);
    out["usage"] = usage();
    return out;
  }
  json chunk(size_t index, const CompletionPiece& piece, const json& finish_reason) const {
    return frame(json::array({{{"index", index},
                               {"text", piece.text},
                               {"logprobs", logprobs ? logprobs_json(piece.tokens) : json(nullptr)},
                               {"finish_reason", finish_reason}}}));
  }
};

}  // namespace

CompletionService::CompletionService(BatchEngine& engine, const Tokenizer& tokenizer, ModelCard card,
                                     RequestLimits limits)
    : engine_(engine), tokenizer_(tokenizer), card_(std::move(card)), limits_(limits) {}

void CompletionService::handle(const HttpRequest& request, const std::shared_ptr<HttpExchange>& exchange) {
  const std::string path = request.target.substr(0, request.target.find('?'));
  const bool get = request.method == "GET", post = request.method == "POST";
  if (path == "/health" && get)
    return exchange->respond(200, dump({{"status", "ok"},
                                        {"completions_pending", engine_.pending()},
                                        {"completions_cancelled", engine_.cancelled()}}));
  if (path == "/v1/models" && get) {
    json model = card_.details;
    model["id"] = card_.name;
    model["object"] = "model";
    model["owned_by"] = "dstrain";
    return exchange->respond(200, dump({{"object", "list"}, {"data", json::array({model})}}));
  }
  if (path == "/v1/completions" && post) return complete(request, exchange);
  if (path == "/health" || path == "/v1/models" || path == "/v1/completions")
    return exchange->respond(405, json_error(405, request.method + " is not a method of " + path));
  exchange->respond(404, json_error(404, "no route " + path + " (POST /v1/completions, GET /v1/models, GET /health)"));
}

void CompletionService::complete(const HttpRequest& http, const std::shared_ptr<HttpExchange>& exchange) {
  CompletionRequest request;
  try {
    request = parse_completion_request(http.body, tokenizer_, limits_);
  } catch (const RequestError& e) {
    return exchange->respond(static_cast<unsigned>(e.status), json_error(static_cast<unsigned>(e.status), e.what(), e.param));
  }
  auto completion = std::make_shared<Completion>();
  completion->id = "cmpl-" + std::to_string(++requests_);
  completion->model = request.model.empty() ? card_.name : request.model;
  completion->created = static_cast<int64_t>(std::time(nullptr));
  completion->logprobs = request.logprobs >= 0;
  completion->choices.resize(request.prompts.size());
  completion->open = request.prompts.size();
  const uint64_t seed = request.seed ? *request.seed : std::random_device{}();
  const bool stream = request.stream;
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    auto job = std::make_shared<CompletionJob>();
    job->prompt = request.prompts[i];
    job->sampling.temperature = request.temperature;
    job->sampling.top_k = request.top_k;
    job->sampling.top_p = request.top_p;
    job->sampling.max_new_tokens = request.max_tokens;
    job->sampling.seed = seed;
    job->sampling.stop_token = tokenizer_.eod_id();
    job->stop = request.stop;
    job->echo = request.echo;
    job->logprobs = request.logprobs;
    // The callbacks run on the engine's thread, one at a time: the completion needs no lock.
    job->on_piece = [completion, exchange, i, stream](CompletionPiece piece) {
      if (stream) return exchange->event(dump(completion->chunk(i, piece, nullptr)));
      Choice& choice = completion->choices[i];
      choice.text += piece.text;
      for (TokenLogprob& t : piece.tokens) choice.tokens.push_back(std::move(t));
    };
    job->on_end = [completion, exchange, i, stream](const CompletionEnd& end) {
      completion->choices[i].end = end;
      if (!end.error.empty()) completion->error = end.error;
      if (stream && end.error.empty()) exchange->event(dump(completion->chunk(i, {}, end.finish_reason)));
      if (--completion->open > 0) return;
      if (stream) {
        if (!completion->error.empty()) exchange->event(json_error(500, "the model failed: " + completion->error));
        exchange->event("[DONE]");
        return exchange->end_events();
      }
      if (!completion->error.empty())
        return exchange->respond(500, json_error(500, "the model failed: " + completion->error));
      exchange->respond(200, dump(completion->whole()));
    };
    completion->jobs.push_back(job);
  }
  exchange->on_client_gone([completion] {
    for (const auto& job : completion->jobs) job->cancelled = true;
  });
  // The events begin before the engine can send one.
  if (!engine_.submit(completion->jobs, [&] {
        if (stream) exchange->begin_events();
      }))
    exchange->respond(503, json_error(503, "the queue is full: retry later"), {{"Retry-After", "1"}});
}

}  // namespace dstrain
