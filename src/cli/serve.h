// `dstrain serve --ckpt CKPT`: a checkpoint's model behind an OpenAI-compatible HTTP endpoint.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

int serve_command(const std::vector<std::string>& args);

}  // namespace dstrain
