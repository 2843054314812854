// `dstrain data import` and `dstrain data inspect`.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

int data_command(const std::vector<std::string>& args);

}  // namespace dstrain
