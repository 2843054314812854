// DeepSeek's FP8 layout of Hugging Face weights, as DeepSeek-V3, V3.1 and R1 are published: the
// projection weights of attention and of the MLPs, experts and shared experts are F8_E4M3 with,
// for each "X.weight", "X.weight_scale_inv" (block scales, fp8_blocks.h), and config.json says so:
//   "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
//                           "weight_block_size": [128, 128]}
// The embedding, the norms, the router's gate, the head and the multi-token prediction module's
// eh_proj stay BF16 (the router's e_score_correction_bias F32).
#pragma once

#include "dstrain/core/torch_api.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dstrain/ckpt/fp8_blocks.h"
#include "dstrain/ckpt/hf_weights.h"

namespace dstrain {

// "X.weight" → "X.weight_scale_inv".
std::string hf_scale_name(const std::string& weight);
// "X.weight_scale_inv" → "X.weight"; "" for any other name.
std::string hf_scaled_weight(const std::string& name);

// Whether DeepSeek stores the parameter `name` of `shape` in FP8: a 2-D "*_proj" weight of a
// layer's self_attn or mlp.
bool hf_fp8_quantizes(const std::string& name, const std::vector<int64_t>& shape);

// config.json's quantization_config (`config`, read from `path`): its weight_block_size, or
// nullopt without one. Throws Error(kCheckpoint) naming the file and the key when it is there
// but not DeepSeek's block-scaled FP8 (quant_method "fp8", fmt "e4m3" where given, two positive
// block sizes).
std::optional<Fp8BlockSize> hf_fp8_block_size(const nlohmann::json& config, const std::string& path);
// The quantization_config of an export in blocks of `block`, as DeepSeek's config.json has it.
nlohmann::json hf_fp8_quantization_config(Fp8BlockSize block);

// What keeps the F8_E4M3 weight `name` of `weights` from being read in blocks of `block`, naming
// the file and the tensor: not 2-D, no scale tensor, a scale of another dtype or shape, or a scale
// that is not finite and positive (the scales are read); "" when nothing does.
std::string hf_fp8_problem(const HfWeights& weights, const std::string& name, Fp8BlockSize block);

// The F8_E4M3 weight `name` times its scales, float32. Throws Error(kCheckpoint) naming the tensor
// as hf_fp8_problem would.
torch::Tensor read_hf_fp8(const HfWeights& weights, const std::string& name, Fp8BlockSize block);

// The FP8 weights of an export, each quantized once: a writer in name order asks for "X.weight",
// then for "X.weight_scale_inv", which comes next; the last weight quantized is kept for it.
class HfFp8Quantizer {
 public:
  // `read`: a weight by parameter name, in any float dtype.
  HfFp8Quantizer(Fp8BlockSize block, std::function<torch::Tensor(const std::string&)> read);
  const Fp8Weight& quantized(const std::string& weight);

 private:
  Fp8BlockSize block_;
  std::function<torch::Tensor(const std::string&)> read_;
  std::string name_;  // of `last_`
  Fp8Weight last_;
};

}  // namespace dstrain
