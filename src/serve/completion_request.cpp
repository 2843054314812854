#include "dstrain/serve/completion_request.h"

#include <nlohmann/json.hpp>

namespace dstrain {
namespace {

using nlohmann::json;

RequestError invalid(const std::string& param, const std::string& message) { return {400, param, message}; }

// The field's value, or nullptr when absent or null (its default then applies).
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

int64_t integer_field(const json& body, const char* name, int64_t fallback, int64_t min_value, int64_t max_value) {
  const json* value = field(body, name);
  if (!value) return fallback;
  if (!value->is_number_integer())
    throw invalid(name, std::string("'") + name + "' must be an integer, not " + value->dump());
  if (value->is_number_unsigned() ? value->get<uint64_t>() > static_cast<uint64_t>(max_value)
                                  : value->get<int64_t>() < min_value || value->get<int64_t>() > max_value)
    throw invalid(name, std::string("'") + name + "' is " + value->dump() + ": expected " + std::to_string(min_value) +
                            " to " + std::to_string(max_value));
  return value->get<int64_t>();
}

double number_field(const json& body, const char* name, double fallback, double min_value, double max_value,
                    bool min_excluded) {
  const json* value = field(body, name);
  if (!value) return fallback;
  if (!value->is_number()) throw invalid(name, std::string("'") + name + "' must be a number, not " + value->dump());
  const double x = value->get<double>();
  if (x > max_value || x < min_value || (min_excluded && x == min_value))
    throw invalid(name, std::string("'") + name + "' is " + value->dump() + ": expected " +
                            (min_excluded ? "more than " : "") + json(min_value).dump() + " to " + json(max_value).dump());
  return x;
}

bool bool_field(const json& body, const char* name) {
  const json* value = field(body, name);
  if (!value) return false;
  if (!value->is_boolean()) throw invalid(name, std::string("'") + name + "' must be true or false, not " + value->dump());
  return value->get<bool>();
}

std::vector<int64_t> token_ids(const json& ids, const RequestLimits& limits) {
  if (ids.empty()) throw invalid("prompt", "a prompt of token ids needs at least one");
  std::vector<int64_t> out;
  for (const json& id : ids) {
    if (!id.is_number_integer())
      throw invalid("prompt", "a token-id prompt holds integers only, not " + id.dump());
    if (id.is_number_unsigned() ? id.get<uint64_t>() >= static_cast<uint64_t>(limits.vocab_size)
                                : id.get<int64_t>() < 0 || id.get<int64_t>() >= limits.vocab_size)
      throw invalid("prompt", "token id " + id.dump() + " is outside the vocabulary (0 to " +
                                  std::to_string(limits.vocab_size - 1) + ")");
    out.push_back(id.get<int64_t>());
  }
  return out;
}

std::vector<int64_t> text_ids(const json& text, const Tokenizer& tokenizer) {
  if (text.get_ref<const std::string&>().empty()) throw invalid("prompt", "the prompt is empty");
  std::vector<int64_t> out;
  if (const std::optional<uint32_t> bos = tokenizer.bos_id()) out.push_back(*bos);
  for (uint32_t id : tokenizer.encode(text.get<std::string>())) out.push_back(id);
  return out;
}

// A string, a list of strings, a list of token ids, or a list of such lists.
std::vector<std::vector<int64_t>> prompts(const json& body, const Tokenizer& tokenizer, const RequestLimits& limits) {
  const json* prompt = field(body, "prompt");
  if (!prompt) throw invalid("prompt", "'prompt' is required");
  if (prompt->is_string()) return {text_ids(*prompt, tokenizer)};
  if (!prompt->is_array() || prompt->empty())
    throw invalid("prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists");
  if (prompt->front().is_number()) return {token_ids(*prompt, limits)};
  std::vector<std::vector<int64_t>> out;
  for (const json& one : *prompt) {
    if (one.is_string()) out.push_back(text_ids(one, tokenizer));
    else if (one.is_array()) out.push_back(token_ids(one, limits));
    else throw invalid("prompt", "a list of prompts holds strings or lists of token ids, not " + one.dump());
  }
  return out;
}

std::vector<std::string> stop_strings(const json& body) {
  const json* stop = field(body, "stop");
  if (!stop) return {};
  if (stop->is_string()) return {stop->get<std::string>()};
  if (!stop->is_array() || stop->size() > 4)
    throw invalid("stop", "'stop' must be a string or a list of up to 4 strings");
  std::vector<std::string> out;
  for (const json& s : *stop) {
    if (!s.is_string() || s.get_ref<const std::string&>().empty())
      throw invalid("stop", "'stop' holds non-empty strings only, not " + s.dump());
    out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& body_text, const Tokenizer& tokenizer,
                                           const RequestLimits& limits) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw invalid("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) throw invalid("", "the body must be a JSON object");
  CompletionRequest request;
  if (const json* model = field(body, "model")) {
    if (!model->is_string()) throw invalid("model", "'model' must be a string");
    request.model = model->get<std::string>();
  }
  request.echo = bool_field(body, "echo");
  request.stream = bool_field(body, "stream");
  request.max_tokens = integer_field(body, "max_tokens", std::min<int64_t>(16, limits.max_tokens_limit), 0,
                                     limits.max_tokens_limit);
  request.temperature = number_field(body, "temperature", 1.0, 0.0, 100.0, false);
  request.top_p = number_field(body, "top_p", 1.0, 0.0, 1.0, /*min_excluded=*/true);
  request.top_k = integer_field(body, "top_k", 0, -1, 1 << 30);
  if (request.top_k < 0) request.top_k = 0;
  request.logprobs = integer_field(body, "logprobs", -1, 0, limits.max_logprobs);
  if (field(body, "seed")) request.seed = static_cast<uint64_t>(integer_field(body, "seed", 0, 0, INT64_MAX));
  integer_field(body, "n", 1, 1, 1);  // one completion a prompt
  integer_field(body, "best_of", 1, 1, 1);
  request.stop = stop_strings(body);
  request.prompts = prompts(body, tokenizer, limits);
  for (const std::vector<int64_t>& prompt : request.prompts)
    if (static_cast<int64_t>(prompt.size()) > limits.context)
      throw invalid("prompt", "the prompt has " + std::to_string(prompt.size()) +
                                  " tokens; the model reads at most " + std::to_string(limits.context));
  return request;
}

}  // namespace dstrain
