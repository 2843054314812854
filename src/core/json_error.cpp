#include "dstrain/core/json_error.h"

namespace dstrain {
namespace {

// The library's message without its "[json.exception.<kind>.<id>] " prefix.
std::string without_code(const std::string& text) {
  if (text.rfind("[json.exception.", 0) != 0) return text;
  const size_t end = text.find("] ");
  return end == std::string::npos ? text : text.substr(end + 2);
}

}  // namespace

std::string describe_json_error(const nlohmann::json::exception& error) {
  if (const auto* parse = dynamic_cast<const nlohmann::json::parse_error*>(&error)) {
    // "parse error at line 1, column 10: syntax error while parsing value - unexpected end of input; ..."
    std::string text = without_code(parse->what());
    const size_t detail = text.find(" - ");
    if (detail != std::string::npos) text = text.substr(detail + 3);
    return "at byte " + std::to_string(parse->byte) + ": " + text;
  }
  std::string text = without_code(error.what());
  // type_error.302: "type must be string, but is number"
  const std::string must = "type must be ", but = ", but is ";
  const size_t at = text.find(must), middle = text.find(but);
  if (at == 0 && middle != std::string::npos)
    return "a " + text.substr(middle + but.size()) + " where a " + text.substr(must.size(), middle - must.size()) +
           " was expected";
  return text;
}

}  // namespace dstrain
