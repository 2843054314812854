// A checkpoint's whole model on one process, as `dstrain generate` and `dstrain serve` load it:
// the checkpoint (a file, or a directory's latest) of any layout, its tokenizer, the device.
#pragma once

#include <memory>
#include <string>

#include "command_args.h"
#include "dstrain/data/tokenizer.h"
#include "dstrain/model/transformer.h"

namespace dstrain {

struct InferenceModel {
  std::string checkpoint;  // the file read
  int64_t step = 0;
  std::string run_name;    // the run directory's name, or the file's
  std::unique_ptr<Tokenizer> tokenizer;
  CausalLM model{nullptr};  // on `device`
  torch::Device device{torch::kCPU};
};

// From the command's --ckpt, --tokenizer, --device and --model.* settings (other settings are
// refused: the command runs the whole model on one process). Throws Error naming the option.
InferenceModel load_inference_model(const CommandArgs& parsed, const std::string& command);

}  // namespace dstrain
