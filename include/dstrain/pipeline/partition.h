// Which decoder layers each virtual stage holds: a contiguous range each, the first also the
// embedding, the last also the final norm, the LM head and the loss.
#pragma once

#include <cstdint>
#include <vector>

#include "dstrain/model/layer_slice.h"
#include "dstrain/model/model_config.h"

namespace dstrain {

// `counts`: layers per virtual stage as the user gave them (parallel.stage_layers), or empty:
// then layers are spread so that the most expensive stage is as cheap as possible, the LM head
// counted by its FLOPs (with a large vocabulary it weighs as much as several layers). Throws
// Error(kUsage) naming the key when the split is impossible (more stages than layers, counts
// that do not add up).
std::vector<LayerSlice> partition_layers(const ModelConfig& model, int64_t seq_len, int virtual_stages_total,
                                         const std::vector<int64_t>& counts);

}  // namespace dstrain
