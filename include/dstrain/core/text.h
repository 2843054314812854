// String tests C++17's std::string lacks (C++20 has them as members), and sizes as a person reads them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dstrain {

inline bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "1.5 GiB", "512 KiB": sizes a person reads at a glance.
inline std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, bytes == std::floor(bytes) ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

// "step 6", or "steps 6-10": the steps first..last that a message speaks of.
inline std::string step_range_text(int64_t first, int64_t last) {
  return first == last ? "step " + std::to_string(first) : "steps " + std::to_string(first) + "-" + std::to_string(last);
}

}  // namespace dstrain
