#include "dstrain/serve/completion_text.h"

#include <algorithm>

namespace dstrain {
namespace {

bool continuation_byte(unsigned char c) { return (c & 0xC0) == 0x80; }

// The bytes a UTF-8 character starting with `lead` has (1 for a byte that starts none).
size_t character_length(unsigned char lead) {
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  if (lead >= 0xE0) return lead <= 0xEF ? 3 : 1;
  if (lead >= 0xC2) return 2;
  return 1;
}

}  // namespace

CompletionText::CompletionText(std::vector<std::string> stop) : stop_(std::move(stop)) {
  stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
  for (const std::string& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
}

bool CompletionText::append(const std::string& piece) {
  if (stopped_) return true;
  // A stop string that occurs now ends in the new piece: search from where it could start.
  const size_t from = text_.size() >= longest_stop_ ? text_.size() - longest_stop_ + 1 : 0;
  text_ += piece;
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, text_.find(s, from));
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  stopped_ = true;
  return true;
}

size_t CompletionText::settled() const {
  if (stopped_) return text_.size();
  // Held back: the longest end of the text that begins a stop string.
  size_t held = 0;
  for (const std::string& s : stop_)
    for (size_t k = std::min(s.size() - 1, text_.size()); k > held; --k)
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        held = k;
        break;
      }
  return whole_utf8_prefix(text_.substr(0, text_.size() - held));
}

size_t whole_utf8_prefix(const std::string& text) {
  // The last character's lead byte: at most three continuation bytes back.
  size_t start = text.size();
  while (start > 0 && text.size() - start < 4 && continuation_byte(static_cast<unsigned char>(text[start - 1]))) --start;
  if (start == 0) return text.size();  // continuation bytes only: no character to wait for
  const size_t lead = start - 1;
  const size_t needed = character_length(static_cast<unsigned char>(text[lead]));
  return needed > text.size() - lead ? lead : text.size();
}

size_t utf8_characters(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(),
                                           [](char c) { return !continuation_byte(static_cast<unsigned char>(c)); }));
}

}  // namespace dstrain
