// `dstrain ckpt inspect FILE` and `dstrain ckpt verify FILE`.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

int ckpt_command(const std::vector<std::string>& args);

}  // namespace dstrain
