// A field of a JSON document a user gave (tokenizer.json, say), with its path in the document
// ("model.merges[3]"): each accessor checks what the field holds, and an error names the file, the
// field and what was expected there, in the document's terms rather than the JSON library's
// ("cannot use at() with array").
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "dstrain/core/error.h"

namespace dstrain {

class JsonField {
 public:
  // `where`: the document (its file); `path`: the field within it ("" for the whole document).
  // `value` outlives the field.
  JsonField(const nlohmann::json& value, std::string where, std::string path = "");

  const nlohmann::json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  bool is_null() const { return value_->is_null(); }
  bool is_object() const { return value_->is_object(); }
  bool is_string() const { return value_->is_string(); }

  // An object's member; missing: an error. (The field must be an object.)
  JsonField operator[](const std::string& key) const;
  // The same, or null when the object lacks it (or is null itself).
  JsonField member_or_null(const std::string& key) const;
  bool has(const std::string& key) const { return value_->is_object() && value_->contains(key); }
  // An array's elements (null: none).
  std::vector<JsonField> elements() const;
  // An object's members in the document's order of keys (null: none).
  std::vector<std::pair<std::string, JsonField>> members() const;

  std::string string() const;
  std::string string_or(const std::string& fallback) const;  // null: the fallback
  bool boolean_or(bool fallback) const;                       // null: the fallback

  // "WHERE: PATH: EXPECTED, found ..." as Error(kUsage).
  [[noreturn]] void fail(const std::string& expected) const;

 private:
  JsonField child(const nlohmann::json& value, const std::string& step) const;

  const nlohmann::json* value_;
  std::string where_, path_;
};

// What a JSON value is, for a message: "a string", "an array of 2", "the number 3", "null".
std::string json_kind(const nlohmann::json& value);

}  // namespace dstrain
