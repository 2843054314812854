// The whole model's parameters by global name with their shapes, from the configuration alone:
// what Hugging Face weights are checked against before an import or an export reads a byte.
// Nothing is built, so that DeepSeek-V3 (61 layers of 256 experts) is described in microseconds;
// the unit tests hold it equal to the names and shapes of built models of every kind.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/model_config.h"

namespace dstrain {

// Sorted by name: those of CausalLM(config, LayerSlice::whole(config)).
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& config);

// The dtype of parameter `name` in a model of `model_dtype`, the one rule that models, imports and
// exports follow: the MoE balancing bias, which gradients do not train (so it has no fp32 master),
// stays fp32, as DeepSeek-V3 publishes it; its steps of bias_update_speed (1e-3) would round to
// nothing in bf16 once it passes 0.5.
c10::ScalarType parameter_dtype(const std::string& name, c10::ScalarType model_dtype);

// The i of a "model.layers.{i}.*" parameter name (a decoder layer's, or after the last one a
// multi-token prediction module's), or -1.
int64_t parameter_layer(const std::string& name);

// How tensor parallelism splits parameter `name` over the ranks of a tp group (Megatron-LM's
// scheme): rank r holds the r-th of T equal blocks of rows (column-parallel products: q, k, v,
// MLA's q_b_proj and kv_b_proj, gate and up; the vocabulary of the embedding and the LM head) or of
// columns (row-parallel products: o_proj, down_proj), or the whole tensor (norms, MLA's
// down-projections, the router, routed experts, the MTP modules' eh_proj).
enum class TensorParallelSplit { kWhole, kRows, kColumns };
TensorParallelSplit tensor_parallel_split(const std::string& name);
// The dimension that split cuts: 0 (rows), 1 (columns), or -1 (the whole tensor).
int64_t tensor_parallel_dim(const std::string& name);

// Under tensor parallelism, whether a rank's gradient of parameter `name` is its part only and the
// group's must be summed: the routed experts' and the router's, each rank routing its own tokens
// (moe.h; the experts' reduction over edp, which spans the tp ranks, sums theirs), and with
// sequence parallelism every whole parameter of the main model's layers (norms, MLA's
// down-projections: Megatron-LM's sequence-parallel parameters), which see the rank's part of the
// sequence or, after the gather, its heads' share of the gradient. The multi-token prediction
// modules compute on the whole sequence, so only their routers' are partial.
bool tensor_parallel_partial_gradient(const std::string& name, const ModelConfig& config, bool sequence_parallel);

}  // namespace dstrain
