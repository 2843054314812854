// String tests C++17's std::string lacks (C++20 has them as members).
#pragma once

#include <string>

namespace dstrain {

inline bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace dstrain
