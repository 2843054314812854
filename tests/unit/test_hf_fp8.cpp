// DeepSeek's FP8 layout of Hugging Face files: config.json's quantization_config, which tensors
// are quantized, and files with F8_E4M3 codes and their scales.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "dstrain/ckpt/fp8_blocks.h"
#include "dstrain/ckpt/hf_fp8.h"
#include "dstrain/ckpt/hf_weights.h"
#include "dstrain/ckpt/safetensors.h"
#include "dstrain/model/parameter_shapes.h"
#include "dstrain/train/train_config.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;
using dstrain::test::TempDir;

namespace {

ModelConfig preset(const std::string& name) {
  OptionTable table = train_option_table();
  return read_model_config(
      parse_command_line(table, {"--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/" + name + ".ini"}).options);
}

}  // namespace

// quantization_config as DeepSeek-V3's config.json has it, and the ways it can be wrong.
TEST(HfFp8, QuantizationConfigIsDeepSeeksAndChecked) {
  const nlohmann::json deepseek = nlohmann::json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "weight_block_size": [128, 128]})");
  EXPECT_EQ(hf_fp8_quantization_config({}), deepseek);
  const auto block = hf_fp8_block_size({{"quantization_config", deepseek}}, "c.json");
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->rows, 128);
  EXPECT_EQ(block->cols, 128);
  EXPECT_FALSE(hf_fp8_block_size({{"model_type", "deepseek_v3"}}, "c.json").has_value());
  const auto small = hf_fp8_block_size({{"quantization_config", hf_fp8_quantization_config({16, 12})}}, "c.json");
  EXPECT_EQ(small->rows, 16);
  EXPECT_EQ(small->cols, 12);
  auto refused = [&](const std::string& key, const nlohmann::json& value, std::initializer_list<std::string> parts) {
    nlohmann::json q = deepseek;
    if (value.is_null()) q.erase(key);
    else q[key] = value;
    expect_error([&] { hf_fp8_block_size({{"quantization_config", q}}, "c.json"); }, ExitCode::kCheckpoint, parts);
  };
  refused("quant_method", "awq", {"c.json: quantization_config.quant_method is \"awq\""});
  refused("fmt", "e5m2", {"c.json: quantization_config.fmt is \"e5m2\""});
  refused("weight_block_size", {128}, {"weight_block_size is [128]", "two positive integers"});
  refused("weight_block_size", {0, 128}, {"weight_block_size is [0,128]"});
  refused("weight_block_size", nullptr, {"weight_block_size is null"});
}

// The tensors that carry weight_scale_inv in DeepSeek-V3's files: the projections of attention
// and of the MLPs, experts and shared experts; not the embedding, norms, router, head or eh_proj.
TEST(HfFp8, QuantizedTensorsAreDeepSeeks) {
  std::set<std::string> quantized;
  for (const auto& [name, shape] : parameter_shapes(preset("tiny-v3")))
    if (hf_fp8_quantizes(name, shape)) quantized.insert(name);
  for (const char* name : {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_b_proj.weight",
                           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                           "model.layers.0.self_attn.kv_b_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight",
                           "model.layers.1.mlp.experts.7.up_proj.weight",
                           "model.layers.2.mlp.shared_experts.down_proj.weight",
                           "model.layers.3.mlp.experts.0.gate_proj.weight"})
    EXPECT_EQ(quantized.count(name), 1u) << name;
  for (const std::string& name : quantized) {
    EXPECT_EQ(name.find("gate.weight"), std::string::npos) << name;
    EXPECT_EQ(name.find("eh_proj"), std::string::npos) << name;
    EXPECT_EQ(name.find("layernorm"), std::string::npos) << name;
  }
  // 3 attention + 1 MTP layers × 5 projections, 1 dense MLP × 3, 3 MoE layers × (8 + 1) × 3.
  EXPECT_EQ(quantized.size(), 4u * 5 + 3 + 3 * 9 * 3);
  EXPECT_FALSE(hf_fp8_quantizes("model.layers.0.mlp.gate.weight", {8, 32}));
  EXPECT_FALSE(hf_fp8_quantizes("model.layers.1.mlp.gate.e_score_correction_bias", {8}));
  EXPECT_TRUE(hf_fp8_quantizes("model.layers.0.self_attn.q_proj.weight", {32, 32}));  // MHA, V2-Lite
  EXPECT_EQ(hf_scale_name("a.weight"), "a.weight_scale_inv");
  EXPECT_EQ(hf_scaled_weight("a.weight_scale_inv"), "a.weight");
  EXPECT_EQ(hf_scaled_weight("a.weight"), "");
}

// E4M3 codes are written as F8_E4M3 and read back as their bytes; the scales and codes of a file
// written by hand dequantize to code × scale.
TEST(HfFp8, FilesWithE4M3CodesRoundTrip) {
  TempDir dir;
  const torch::Tensor codes = torch::tensor({0x38, 0xB8, 0x7E, 0x01, 0x00, 0x40}, torch::kUInt8).reshape({2, 3});
  const torch::Tensor scales = torch::tensor({0.5f, 4.0f}).reshape({2, 1});
  const std::map<std::string, torch::Tensor> tensors = {{"m.weight", codes}, {"m.weight_scale_inv", scales}};
  write_safetensors(dir.path("model.safetensors"),
                    {{"m.weight", torch::kUInt8, {2, 3}, /*e4m3=*/true}, {"m.weight_scale_inv", torch::kFloat32, {2, 1}}},
                    [&](const std::string& name) { return tensors.at(name); }, {});
  const HfWeights weights(dir.path("model.safetensors"));
  EXPECT_EQ(weights.find("m.weight")->dtype, "F8_E4M3");
  EXPECT_TRUE(torch::equal(weights.read_e4m3("m.weight"), codes));
  expect_error([&] { weights.read("m.weight"); }, ExitCode::kCheckpoint, {"tensor m.weight", "dtype F8_E4M3"});
  expect_error([&] { weights.read_e4m3("m.weight_scale_inv"); }, ExitCode::kCheckpoint,
               {"tensor m.weight_scale_inv has dtype F32, not F8_E4M3"});
  const torch::Tensor expected = torch::tensor({0.5f, -0.5f, 224.0f, 4.0f * std::ldexp(1.0f, -9), 0.0f, 8.0f}).reshape({2, 3});
  EXPECT_TRUE(torch::equal(read_hf_fp8(weights, "m.weight", {1, 3}), expected));
  EXPECT_EQ(hf_fp8_problem(weights, "m.weight", {1, 3}), "");
  EXPECT_NE(hf_fp8_problem(weights, "m.weight", {1, 2}).find("needs [2, 2]"), std::string::npos);
  EXPECT_THROW(write_safetensors(dir.path("bad.safetensors"), {{"x", torch::kFloat32, {1}, /*e4m3=*/true}},
                                 [](const std::string&) { return torch::zeros({1}); }, {}),
               Error);
}
