// GPT-2's byte-level alphabet: every byte maps to one printable Unicode character, so that a
// vocabulary of strings can hold any byte sequence (tokenizer.json stores "Ġthe" for " the").
// The mapping is the one of GPT-2's bytes_to_unicode(), which Hugging Face's ByteLevel
// pre-tokenizer and decoder use too.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace dstrain::byte_level {

// The UTF-8 encoding of the character that stands for each byte.
const std::array<std::string, 256>& byte_to_chars();

// The bytes a byte-level string stands for; false when it holds a character outside the
// alphabet (then `bytes` is unspecified).
bool chars_to_bytes(const std::string& chars, std::string* bytes);

}  // namespace dstrain::byte_level
