// The config.json of a Hugging Face model with the shape of a dstrain model: what transformers
// (and DeepSeek's own modelling code) need to load exported weights. dstrain's [model] keys are
// already Hugging Face's names, save a few (num_layers, num_heads, num_kv_heads, max_seq_len, the
// rope_* YaRN keys, which become rope_scaling).
#pragma once

#include "dstrain/core/torch_api.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "dstrain/model/model_config.h"

namespace dstrain {

// "bfloat16", "float16", "float32": config.json's torch_dtype.
const char* hf_torch_dtype(torch::ScalarType dtype);

struct HfConfig {
  nlohmann::json json;
  // What the exported model cannot mean in that architecture (a dense model with interleaved
  // RoPE, which Llama rotates half-split; MoE without MLA, which DeepSeek-V2's code lacks).
  std::vector<std::string> warnings;
};

// DeepseekV3ForCausalLM (model_type deepseek_v3) when the router is V3's (noaux_tc, or sigmoid
// scores); DeepseekV2ForCausalLM when the model has MLA or MoE otherwise; LlamaForCausalLM for a
// dense DeepSeek-LLM, as DeepSeek publishes those. tie_word_embeddings is false: dstrain's
// lm_head is a weight of its own.
HfConfig hf_config(const ModelConfig& model, torch::ScalarType dtype);

// Where a Hugging Face model's config.json (`theirs`) describes another computation than `model`:
// one line per setting ("rope_scaling.factor: 40 there, 1 here (model.rope_scaling_factor)"), and
// the `--model.key value` overrides that make `model` agree where dstrain has the setting. Only
// what changes the logits is compared (not max_position_embeddings, initializer_range,
// aux_loss_alpha, num_nextn_predict_layers or torch_dtype). A config.json without a key says
// nothing about it, save HF's defaults: no rope_scaling, DeepSeek-V2/V3's interleaved RoPE.
struct HfConfigDifferences {
  std::vector<std::string> lines, overrides;
};
HfConfigDifferences hf_config_differences(const ModelConfig& model, const nlohmann::json& theirs);

}  // namespace dstrain
