// The /model group of a checkpoint file (a run's, an import, ckpt.save_final's final_model.h5):
// every parameter by global Hugging Face name with its full shape, as fp32, without reading the
// rest of the checkpoint: what tests compare whole models of different layouts with.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

namespace dstrain {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// fp32 CPU tensors sorted by name. Throws Error(kCheckpoint) naming the file or dataset.
NamedTensors read_parameter_file(const std::string& path);

}  // namespace dstrain
