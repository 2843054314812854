#include "dstrain/core/json_field.h"

namespace dstrain {

std::string json_kind(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array of " + std::to_string(value.size());
    case nlohmann::json::value_t::string: return "the string " + value.dump();
    case nlohmann::json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    default: return value.is_number() ? "the number " + value.dump() : "a value of another kind";
  }
}

JsonField::JsonField(const nlohmann::json& value, std::string where, std::string path)
    : value_(&value), where_(std::move(where)), path_(std::move(path)) {}

JsonField JsonField::child(const nlohmann::json& value, const std::string& step) const {
  const bool index = !step.empty() && step[0] == '[';
  return JsonField(value, where_, path_.empty() || index ? path_ + step : path_ + "." + step);
}

void JsonField::fail(const std::string& expected) const {
  throw Error(ExitCode::kUsage, where_ + ": " + (path_.empty() ? "the document" : path_) + ": expected " + expected +
                                    ", found " + json_kind(*value_));
}

JsonField JsonField::operator[](const std::string& key) const {
  if (!value_->is_object()) fail("an object with \"" + key + "\"");
  const auto found = value_->find(key);
  if (found == value_->end())
    throw Error(ExitCode::kUsage, where_ + ": " + (path_.empty() ? "" : path_ + ".") + key + ": missing");
  return child(*found, key);
}

JsonField JsonField::member_or_null(const std::string& key) const {
  static const nlohmann::json null_value;  // (immutable)
  if (value_->is_null()) return child(null_value, key);
  if (!value_->is_object()) fail("an object");
  const auto found = value_->find(key);
  return child(found == value_->end() ? null_value : *found, key);
}

std::vector<JsonField> JsonField::elements() const {
  std::vector<JsonField> all;
  if (value_->is_null()) return all;
  if (!value_->is_array()) fail("an array");
  for (size_t i = 0; i < value_->size(); ++i) all.push_back(child((*value_)[i], "[" + std::to_string(i) + "]"));
  return all;
}

std::vector<std::pair<std::string, JsonField>> JsonField::members() const {
  std::vector<std::pair<std::string, JsonField>> all;
  if (value_->is_null()) return all;
  if (!value_->is_object()) fail("an object");
  for (const auto& [key, value] : value_->items()) all.emplace_back(key, child(value, "'" + key + "'"));
  return all;
}

std::string JsonField::string() const {
  if (!value_->is_string()) fail("a string");
  return value_->get<std::string>();
}

std::string JsonField::string_or(const std::string& fallback) const { return is_null() ? fallback : string(); }

bool JsonField::boolean_or(bool fallback) const {
  if (is_null()) return fallback;
  if (!value_->is_boolean()) fail("true or false");
  return value_->get<bool>();
}

}  // namespace dstrain
