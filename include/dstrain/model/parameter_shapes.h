// The whole model's parameters by global name with their shapes, from the configuration alone:
// what Hugging Face weights are checked against before an import or an export reads a byte.
// Nothing is built, so that DeepSeek-V3 (61 layers of 256 experts) is described in microseconds;
// the unit tests hold it equal to the names and shapes of built models of every kind.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/model_config.h"

namespace dstrain {

// Sorted by name: those of CausalLM(config, LayerSlice::whole(config)).
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& config);

}  // namespace dstrain
