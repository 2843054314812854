#include "dstrain/data/unicode_normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/utf8.h>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

const icu::Normalizer2* instance_of(UnicodeNormalizer::Form form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case UnicodeNormalizer::Form::kNfc: normalizer = icu::Normalizer2::getNFCInstance(status); break;
    case UnicodeNormalizer::Form::kNfd: normalizer = icu::Normalizer2::getNFDInstance(status); break;
    case UnicodeNormalizer::Form::kNfkc: normalizer = icu::Normalizer2::getNFKCInstance(status); break;
    case UnicodeNormalizer::Form::kNfkd: normalizer = icu::Normalizer2::getNFKDInstance(status); break;
  }
  if (U_FAILURE(status) || normalizer == nullptr)
    throw Error(ExitCode::kInternal, std::string("ICU has no Unicode normalization data: ") + u_errorName(status));
  return normalizer;
}

// Whether no character of `text` can change: ASCII never does, and for NFC nothing below U+0300
// (the first combining mark) does either; that is the lead bytes below 0xCC.
bool surely_unchanged(std::string_view text, UnicodeNormalizer::Form form) {
  const unsigned char limit = form == UnicodeNormalizer::Form::kNfc ? 0xCC : 0x80;
  for (char c : text)
    if (static_cast<unsigned char>(c) >= limit) return false;
  return true;
}

}  // namespace

std::optional<UnicodeNormalizer::Form> UnicodeNormalizer::form_named(const std::string& type) {
  if (type == "NFC") return Form::kNfc;
  if (type == "NFD") return Form::kNfd;
  if (type == "NFKC") return Form::kNfkc;
  if (type == "NFKD") return Form::kNfkd;
  return std::nullopt;
}

UnicodeNormalizer::UnicodeNormalizer(Form form) : form_(form), icu_(instance_of(form)) {}

std::string_view UnicodeNormalizer::normalize(std::string_view text, std::string* storage) const {
  if (surely_unchanged(text, form_)) return text;
  const auto* normalizer = static_cast<const icu::Normalizer2*>(icu_);
  storage->clear();
  icu::StringByteSink<std::string> sink(storage);
  // Each stretch of valid UTF-8 is normalized on its own; an invalid byte is copied as it is.
  const auto n = static_cast<int32_t>(text.size());
  int32_t valid_from = 0;
  auto flush = [&](int32_t to) {
    if (to <= valid_from) return;
    UErrorCode status = U_ZERO_ERROR;
    normalizer->normalizeUTF8(0, icu::StringPiece(text.data() + valid_from, to - valid_from), sink, nullptr, status);
    if (U_FAILURE(status))
      throw Error(ExitCode::kInternal, std::string("Unicode normalization failed: ") + u_errorName(status));
  };
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c = 0;
    U8_NEXT(text.data(), i, n, c);
    if (c >= 0) continue;
    flush(start);
    storage->append(text.data() + start, static_cast<size_t>(i - start));
    valid_from = i;
  }
  flush(n);
  return *storage;
}

}  // namespace dstrain
