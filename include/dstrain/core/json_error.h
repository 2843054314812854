// nlohmann::json's exceptions in our words: the position of a syntax error, or what the document
// held where something else was expected, without the library's "[json.exception.type_error.302]".
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace dstrain {

// "at byte 17: unexpected end of input; expected '[', '{', or a literal" or
// "a number where a string was expected" (the library's text, its code left out).
std::string describe_json_error(const nlohmann::json::exception& error);

}  // namespace dstrain
