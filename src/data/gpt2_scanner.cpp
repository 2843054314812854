#include "gpt2_scanner.h"

#include <array>
#include <cstdint>

namespace dstrain::gpt2 {
namespace {

enum Class : uint8_t { kOther, kLetter, kDigit, kSpace, kNonAscii };

// \s is Unicode White_Space: in ASCII \t \n \v \f \r and space (not 0x1C-0x1F).
constexpr std::array<Class, 256> make_classes() {
  std::array<Class, 256> classes{};
  for (int c = 0; c < 256; ++c) {
    Class k = kOther;
    if (c >= 0x80) k = kNonAscii;
    else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) k = kLetter;
    else if (c >= '0' && c <= '9') k = kDigit;
    else if (c == ' ' || (c >= '\t' && c <= '\r')) k = kSpace;
    classes[c] = k;
  }
  return classes;
}
constexpr std::array<Class, 256> kClasses = make_classes();

Class class_at(std::string_view text, size_t i) { return kClasses[static_cast<unsigned char>(text[i])]; }

// The end of a run of `kind` starting at i; 0 when it runs into a non-ASCII byte (which could
// belong to it: a letter, digit or white space beyond ASCII).
size_t run_end(std::string_view text, size_t i, Class kind) {
  while (i < text.size() && class_at(text, i) == kind) ++i;
  return i < text.size() && class_at(text, i) == kNonAscii ? 0 : i;
}

}  // namespace

size_t ascii_match_end(std::string_view text, size_t pos) {
  const size_t n = text.size();
  const Class first = class_at(text, pos);
  if (first == kNonAscii) return 0;
  // 's 't 're 've 'm 'll 'd: before the punctuation alternative.
  if (text[pos] == '\'' && pos + 1 < n) {
    const char a = text[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (pos + 2 < n) {
      const char b = text[pos + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
    }
  }
  // " ?X+" for letters, digits and other characters: an optional space, then a run.
  size_t start = pos;
  Class kind = first;
  if (text[pos] == ' ' && pos + 1 < n) {
    const Class next = class_at(text, pos + 1);
    if (next == kNonAscii) return 0;
    if (next != kSpace) {
      start = pos + 1;
      kind = next;
    }
  }
  if (kind == kLetter || kind == kDigit || kind == kOther) return run_end(text, start, kind);
  // White space: \s+(?!\S) takes the run but its last character when something else follows
  // (that character then starts the next piece), else \s+ takes the whole run.
  const size_t end = run_end(text, pos, kSpace);
  if (end == 0) return 0;
  if (end == n || end - pos == 1) return end;
  return end - 1;
}

}  // namespace dstrain::gpt2
