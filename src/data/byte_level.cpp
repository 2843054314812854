#include "dstrain/data/byte_level.h"

#include <unordered_map>

namespace dstrain::byte_level {
namespace {

std::string utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

// bytes_to_unicode(): printable Latin-1 bytes stand for themselves; the others (controls,
// space, 0x7F-0xA0, 0xAD) take the code points 256, 257, ... in byte order.
std::array<uint32_t, 256> code_points() {
  std::array<uint32_t, 256> points{};
  uint32_t next_extra = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    points[b] = printable ? b : next_extra++;
  }
  return points;
}

const std::unordered_map<uint32_t, uint8_t>& chars_to_byte() {
  static const std::unordered_map<uint32_t, uint8_t> table = [] {
    std::unordered_map<uint32_t, uint8_t> t;
    std::array<uint32_t, 256> points = code_points();
    for (uint32_t b = 0; b < 256; ++b) t[points[b]] = static_cast<uint8_t>(b);
    return t;
  }();
  return table;
}

}  // namespace

const std::array<std::string, 256>& byte_to_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    std::array<uint32_t, 256> points = code_points();
    for (int b = 0; b < 256; ++b) t[b] = utf8(points[b]);
    return t;
  }();
  return table;
}

bool chars_to_bytes(const std::string& chars, std::string* bytes) {
  bytes->clear();
  const auto& table = chars_to_byte();
  for (size_t i = 0; i < chars.size();) {
    const auto c = static_cast<unsigned char>(chars[i]);
    uint32_t point;
    size_t length;
    if (c < 0x80) { point = c; length = 1; }
    else if ((c & 0xE0) == 0xC0) { point = c & 0x1F; length = 2; }
    else if ((c & 0xF0) == 0xE0) { point = c & 0x0F; length = 3; }
    else return false;  // the alphabet stops at U+0143: never four bytes
    if (i + length > chars.size()) return false;
    for (size_t k = 1; k < length; ++k) point = (point << 6) | (static_cast<unsigned char>(chars[i + k]) & 0x3F);
    auto found = table.find(point);
    if (found == table.end()) return false;
    bytes->push_back(static_cast<char>(found->second));
    i += length;
  }
  return true;
}

}  // namespace dstrain::byte_level
