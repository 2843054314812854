// DeepSeek's FP8 weights in Hugging Face files: which tensors, their scales and config.json's
// quantization_config (hf_fp8.h).
#include "dstrain/ckpt/hf_fp8.h"

#include <utility>

#include "dstrain/ckpt/format.h"
#include "dstrain/ckpt/safetensors.h"
#include "dstrain/core/error.h"
#include "dstrain/core/text.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;
const std::string kWeight = ".weight", kScaleSuffix = "_scale_inv";

bool is_float_dtype(const std::string& dtype) { return dtype == "F32" || dtype == "BF16" || dtype == "F16"; }

std::optional<int64_t> positive_integer(const nlohmann::json& value) {
  if (!value.is_number_integer() || value.get<int64_t>() <= 0) return std::nullopt;
  return value.get<int64_t>();
}

}  // namespace

std::string hf_scale_name(const std::string& weight) { return weight + kScaleSuffix; }

std::string hf_scaled_weight(const std::string& name) {
  if (!ends_with(name, kWeight + kScaleSuffix)) return "";
  return name.substr(0, name.size() - kScaleSuffix.size());
}

bool hf_fp8_quantizes(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() != 2 || name.rfind("model.layers.", 0) != 0) return false;
  const bool in_block = name.find(".self_attn.") != std::string::npos || name.find(".mlp.") != std::string::npos;
  // "_proj.weight" and kv_a_proj_with_mqa: the projections; mlp.gate.weight, the router, is not one.
  return in_block && (ends_with(name, "_proj.weight") || ends_with(name, "_proj_with_mqa.weight"));
}

std::optional<Fp8BlockSize> hf_fp8_block_size(const nlohmann::json& config, const std::string& path) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const nlohmann::json& q = *it;
  const std::string where = path + ": quantization_config";
  if (!q.is_object()) throw Error(kCode, where + " is not a JSON object");
  const std::string method = q.value("quant_method", std::string());
  if (method != "fp8")
    throw Error(kCode, where + ".quant_method is \"" + method +
                           "\"; dstrain reads DeepSeek's block-scaled \"fp8\" weights only");
  if (q.contains("fmt") && q["fmt"] != "e4m3")
    throw Error(kCode, where + ".fmt is " + q["fmt"].dump() + "; dstrain reads \"e4m3\" weights only");
  const nlohmann::json size = q.value("weight_block_size", nlohmann::json());
  if (!size.is_array() || size.size() != 2 || !positive_integer(size[0]) || !positive_integer(size[1]))
    throw Error(kCode, where + ".weight_block_size is " + size.dump() +
                           "; expected two positive integers, such as [128, 128] (per-block scales)");
  return Fp8BlockSize{size[0].get<int64_t>(), size[1].get<int64_t>()};
}

nlohmann::json hf_fp8_quantization_config(Fp8BlockSize block) {
  return {{"activation_scheme", "dynamic"},
          {"fmt", "e4m3"},
          {"quant_method", "fp8"},
          {"weight_block_size", {block.rows, block.cols}}};
}

std::string hf_fp8_problem(const HfWeights& weights, const std::string& name, Fp8BlockSize block) {
  const SafetensorsEntry* weight = weights.find(name);
  if (!weight) return "no tensor " + name;
  const std::string here = weights.file_of(name) + ": tensor " + name;
  if (weight->shape.size() != 2)
    return here + " is " + kSafetensorsE4M3 + " of shape " + shape_text(weight->shape) +
           "; dstrain reads 2-D block-scaled FP8 weights only";
  const std::string scale_name = hf_scale_name(name);
  const SafetensorsEntry* scale = weights.find(scale_name);
  if (!scale) return here + " is " + kSafetensorsE4M3 + ", and no file holds its scales " + scale_name;
  const std::string there = weights.file_of(scale_name) + ": tensor " + scale_name;
  if (!is_float_dtype(scale->dtype)) return there + " has dtype " + scale->dtype + "; scales are F32 (or BF16, F16)";
  const std::vector<int64_t> expected = fp8_scale_shape(weight->shape, block);
  if (scale->shape != expected)
    return there + " has shape " + shape_text(scale->shape) + "; " + name + " " + shape_text(weight->shape) +
           " in blocks of " + shape_text({block.rows, block.cols}) +
           " (config.json's quantization_config.weight_block_size) needs " + shape_text(expected);
  const std::string problem = fp8_scale_problem(weights.read(scale_name));
  return problem.empty() ? "" : there + ": " + problem;
}

torch::Tensor read_hf_fp8(const HfWeights& weights, const std::string& name, Fp8BlockSize block) {
  const std::string scale_name = hf_scale_name(name);
  if (!weights.find(scale_name))
    throw Error(kCode, weights.file_of(name) + ": tensor " + name + " is " + kSafetensorsE4M3 +
                           ", and no file holds its scales " + scale_name);
  return fp8_dequantize(weights.read_e4m3(name), weights.read(scale_name), block, name);
}

HfFp8Quantizer::HfFp8Quantizer(Fp8BlockSize block, std::function<torch::Tensor(const std::string&)> read)
    : block_(block), read_(std::move(read)) {}

const Fp8Weight& HfFp8Quantizer::quantized(const std::string& weight) {
  if (weight != name_) {
    last_ = Fp8Weight{};  // the previous weight goes before the next is read
    name_.clear();
    last_ = fp8_quantize(read_(weight), block_, weight);
    name_ = weight;
  }
  return last_;
}

}  // namespace dstrain
