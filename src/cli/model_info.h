// `dstrain model info`: what a configuration costs before any GPU is spent on it.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

int model_command(const std::vector<std::string>& args);

}  // namespace dstrain
