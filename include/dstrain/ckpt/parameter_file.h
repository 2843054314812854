// A whole model's parameters in one HDF5 file, by global Hugging Face name: dataset
// /model/<name> with the full shape, in fp32 (h5dump reads it). What ckpt.save_final writes at the
// end of a run; checkpoints lay out their /model group the same way.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

namespace dstrain {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Any dtype, any device; written as fp32 under PATH.tmp, then renamed, so that the file appears
// only when complete. Throws Error(kCheckpoint) naming the file.
void write_parameter_file(const std::string& path, const NamedTensors& params);

// fp32 CPU tensors sorted by name. Throws Error(kCheckpoint) naming the file or dataset.
NamedTensors read_parameter_file(const std::string& path);

}  // namespace dstrain
