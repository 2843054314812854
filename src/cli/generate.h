// `dstrain generate --ckpt CKPT --prompt TEXT`: text from a checkpoint of any layout.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

int generate_command(const std::vector<std::string>& args);

}  // namespace dstrain
