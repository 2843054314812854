// `dstrain eval --ckpt CKPT --data CORPUS`: a checkpoint's loss and perplexity on a corpus.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

int eval_command(int argc, char** argv, const std::vector<std::string>& args);

}  // namespace dstrain
