// The Unicode normalization a tokenizer.json's "normalizer" asks for (NFC, NFD, NFKC or NFKD),
// by ICU. Qwen2's and Qwen3's files (and DeepSeek-R1's distillations of them) normalize text to
// NFC before splitting it, so "e" followed by U+0301 and "é" become the same tokens.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dstrain {

class UnicodeNormalizer {
 public:
  enum class Form { kNfc, kNfd, kNfkc, kNfkd };
  // The form of a normalizer "type" ("NFC", ...); nullopt for any other type.
  static std::optional<Form> form_named(const std::string& type);

  explicit UnicodeNormalizer(Form form);

  // `text` in the form: `text` itself where nothing changes (the common case, found without
  // copying), else the normalized text in *storage. Bytes that are not valid UTF-8 stay as they
  // are and nothing composes across them. Thread-safe.
  std::string_view normalize(std::string_view text, std::string* storage) const;

 private:
  Form form_;
  const void* icu_ = nullptr;  // const icu::Normalizer2*, owned by ICU
};

}  // namespace dstrain
