// Safetensors files, Hugging Face weight directories and config.json: the bytes written checked
// against the format's definition by hand, round trips, and damaged files refused clearly.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "dstrain/ckpt/hf_config.h"
#include "dstrain/ckpt/hf_conversion.h"
#include "dstrain/ckpt/hf_weights.h"
#include "dstrain/ckpt/safetensors.h"
#include "dstrain/core/files.h"
#include "dstrain/model/parameter_shapes.h"
#include "dstrain/model/transformer.h"
#include "dstrain/train/train_config.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;
using dstrain::test::TempDir;

namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A file made by hand: the 8-byte length of `header`, `header`, then `buffer`.
void write_raw(const std::string& path, const std::string& header, const std::string& buffer,
               uint64_t claimed_length = UINT64_MAX) {
  const uint64_t length = claimed_length == UINT64_MAX ? header.size() : claimed_length;
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((length >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << bytes << header << buffer;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string text;
  for (unsigned char c : bytes) text += std::string(1, digits[c >> 4]) + digits[c & 15] + " ";
  return text;
}

torch::Tensor values(std::vector<float> v, torch::ScalarType dtype) {
  return torch::tensor(v, torch::kFloat32).to(dtype);
}

ModelConfig preset(const std::string& name, std::vector<std::string> overrides = {}) {
  OptionTable table = train_option_table();
  std::vector<std::string> args = {"--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/" + name + ".ini"};
  args.insert(args.end(), overrides.begin(), overrides.end());
  return read_model_config(parse_command_line(table, args).options);
}

}  // namespace

// The header's exact text, its length and padding, and every tensor's bytes as IEEE and bfloat16
// bit patterns worked out by hand (1.5, -2, 0.25, 3), in name order whatever the input order.
TEST(Safetensors, WritesTheDocumentedByteLayout) {
  TempDir dir;
  const std::string path = dir.path("t.safetensors");
  write_safetensors(path,
                    {{"b.f32", values({1.5f, -2.f, 0.25f, 3.f}, torch::kFloat32).reshape({2, 2})},
                     {"c.f16", values({1.5f, -2.f}, torch::kFloat16)},
                     {"a.bf16", values({1.5f, -2.f, 0.25f}, torch::kBFloat16)}},
                    {{"format", "pt"}});
  const std::string bytes = file_bytes(path);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a.bf16":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
      R"("b.f32":{"dtype":"F32","shape":[2,2],"data_offsets":[6,22]},)"
      R"("c.f16":{"dtype":"F16","shape":[2],"data_offsets":[22,26]}})";
  const size_t padded = (header.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes.size(), 8 + padded + 26);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(length, padded);
  EXPECT_EQ(bytes.substr(8, header.size()), header);
  EXPECT_EQ(bytes.substr(8 + header.size(), padded - header.size()), std::string(padded - header.size(), ' '));
  const std::string expected_data = std::string("\xc0\x3f\x00\xc0\x80\x3e", 6) +                // bf16
                                    std::string("\x00\x00\xc0\x3f\x00\x00\x00\xc0", 8) +        // f32 1.5, -2
                                    std::string("\x00\x00\x80\x3e\x00\x00\x40\x40", 8) +        // f32 0.25, 3
                                    std::string("\x00\x3e\x00\xc0", 4);                         // f16 1.5, -2
  EXPECT_EQ(hex(bytes.substr(8 + padded)), hex(expected_data));

  const SafetensorsReader reader(path);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  ASSERT_EQ(reader.entries().size(), 3u);
  EXPECT_EQ(reader.find("b.f32")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(reader.find("b.f32")->begin, 6u);
  EXPECT_EQ(reader.read("b.f32")[1][1].item<float>(), 3.f);
  EXPECT_EQ(reader.read("a.bf16").scalar_type(), torch::kBFloat16);
}

TEST(Safetensors, RoundTripsEveryDtypeBitwiseAndDeterministically) {
  TempDir dir;
  torch::manual_seed(7);
  const NamedTensors tensors = {{"model.embed_tokens.weight", torch::randn({5, 3}).to(torch::kBFloat16)},
                                {"model.norm.weight", torch::randn({3}).to(torch::kFloat16)},
                                {"lm_head.weight", torch::randn({5, 3})},
                                {"scalar", torch::tensor(2.5f)},
                                {"empty", torch::zeros({0, 4})}};
  write_safetensors(dir.path("a.safetensors"), tensors, {});
  const SafetensorsReader reader(dir.path("a.safetensors"));
  EXPECT_TRUE(reader.metadata().empty());
  for (const auto& [name, t] : tensors) {
    const torch::Tensor back = reader.read(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(back, t)) << name;
  }
  NamedTensors reversed(tensors.rbegin(), tensors.rend());
  write_safetensors(dir.path("b.safetensors"), reversed, {});
  EXPECT_EQ(file_bytes(dir.path("a.safetensors")), file_bytes(dir.path("b.safetensors")));
  EXPECT_FALSE(files::exists(dir.path("a.safetensors.tmp")));
}

TEST(Safetensors, DamagedFilesAreClearErrors) {
  TempDir dir;
  const ExitCode code = ExitCode::kCheckpoint;
  const std::string good = dir.path("good.safetensors");
  write_safetensors(good, {{"x", torch::ones({4})}, {"y", torch::ones({2}).to(torch::kBFloat16)}}, {});
  const std::string bytes = file_bytes(good);

  const std::string truncated = dir.path("truncated.safetensors");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() - 2);
  expect_error([&] { SafetensorsReader r(truncated); }, code, {truncated, "tensor y", "beyond the end of the data"});

  const std::string too_long = dir.path("too-long.safetensors");
  write_raw(too_long, "{}", "", 1000);
  expect_error([&] { SafetensorsReader r(too_long); }, code, {too_long, "header length 1000", "beyond the end"});

  const std::string tiny = dir.path("tiny.safetensors");
  std::ofstream(tiny, std::ios::binary) << "abc";
  expect_error([&] { SafetensorsReader r(tiny); }, code, {tiny, "too short"});

  const std::string malformed = dir.path("malformed.safetensors");
  write_raw(malformed, "{\"x\": {\"dtype\": ", "");
  expect_error([&] { SafetensorsReader r(malformed); }, code, {malformed, "not a JSON object"});

  const std::string overlap = dir.path("overlap.safetensors");
  write_raw(overlap,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(12, '\0'));
  expect_error([&] { SafetensorsReader r(overlap); }, code, {overlap, "tensors a and b overlap"});

  const std::string wrong_size = dir.path("wrong-size.safetensors");
  write_raw(wrong_size, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  expect_error([&] { SafetensorsReader r(wrong_size); }, code, {wrong_size, "tensor a", "span 8 bytes", "needs 12"});

  const std::string unknown = dir.path("unknown.safetensors");
  write_raw(unknown, R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0'));
  expect_error([&] { SafetensorsReader r(unknown); }, code, {unknown, "tensor a", "unknown dtype \"Q7\""});

  const std::string negative = dir.path("negative.safetensors");
  write_raw(negative, R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  expect_error([&] { SafetensorsReader r(negative); }, code, {negative, "tensor a", "non-negative"});

  // FP8 is a well-formed file whose codes come as bytes (read_e4m3), never as if they were values.
  const std::string fp8 = dir.path("fp8.safetensors");
  write_raw(fp8, R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]}})", std::string("\x38\xb8\x7e\x00", 4));
  const SafetensorsReader reader(fp8);
  EXPECT_EQ(reader.find("w")->dtype, "F8_E4M3");
  expect_error([&] { reader.read("w"); }, code, {fp8, "tensor w", "dtype F8_E4M3"});
  EXPECT_TRUE(torch::equal(reader.read_e4m3("w"), torch::tensor({0x38, 0xb8, 0x7e, 0x00}, torch::kUInt8).reshape({2, 2})));
  expect_error([&] { reader.read("v"); }, code, {fp8, "no tensor v"});
  expect_error([&] { SafetensorsReader r(dir.path("absent.safetensors")); }, code, {"absent.safetensors", "no such file"});
}

// The tensors must tile the data exactly, as the format's reference implementation demands: a
// header length one short (the JSON still whole, its padding space cut) shifted every tensor by a
// byte and imported without a word.
TEST(Safetensors, TensorsMustTileTheDataExactly) {
  TempDir dir;
  const ExitCode code = ExitCode::kCheckpoint;
  const std::string good = dir.path("good.safetensors");
  write_safetensors(good, {{"x", torch::ones({3})}, {"y", torch::ones({2}).to(torch::kBFloat16)}}, {});
  std::string bytes = file_bytes(good);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  ASSERT_EQ(bytes[8 + length - 1], ' ') << "the writer pads its header with spaces";
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(((length - 1) >> (8 * i)) & 0xff);
  const std::string short_header = dir.path("short-header.safetensors");
  std::ofstream(short_header, std::ios::binary) << bytes;
  expect_error([&] { SafetensorsReader r(short_header); }, code, {short_header, "the tensors end at byte", "header length"});

  const std::string hole = dir.path("hole.safetensors");
  write_raw(hole, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(12, '\0'));
  expect_error([&] { SafetensorsReader r(hole); }, code, {hole, "bytes 4 to 8", "before tensor b", "belong to no tensor"});

  const std::string trailing = dir.path("trailing.safetensors");
  write_raw(trailing, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(6, '\0'));
  expect_error([&] { SafetensorsReader r(trailing); }, code, {trailing, "end at byte 4", "holds 6"});

  // Zero-sized tensors tile too, at any offset within the data.
  const std::string empty = dir.path("empty.safetensors");
  write_raw(empty, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            std::string(4, '\0'));
  EXPECT_NO_THROW(SafetensorsReader r(empty));
}

// Shards of at most the given size in name order, the index as transformers writes it, and a
// later export into the same directory that replaces the earlier one's files.
TEST(HfWeights, ShardsWithIndexAndSingleFileRoundTrip) {
  TempDir dir;
  std::map<std::string, torch::Tensor> by_name = {{"a", torch::arange(4, torch::kFloat32)},
                                                  {"b", torch::arange(8, torch::kFloat32).to(torch::kBFloat16)},
                                                  {"c", torch::full({2, 2}, 3.0f)},
                                                  {"d", torch::arange(2, torch::kFloat32)}};
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, t] : by_name) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  auto source = [&](const std::string& name) { return by_name.at(name); };
  const std::string out = dir.path("out");
  // 16 + 16 bytes exceed 20: a, then b, then c + d (16 + 8 = 24 > 20: d alone).
  const std::vector<std::string> files = write_hf_weights(out, specs, source, 20);
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                             "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                                             "model.safetensors.index.json"}));
  std::ifstream index_file(out + "/model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(index_file);
  EXPECT_EQ(index["metadata"]["total_size"], 16 + 16 + 16 + 8);
  EXPECT_EQ(index["weight_map"]["c"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00004-of-00004.safetensors");
  const HfWeights sharded(out);
  EXPECT_EQ(sharded.names(), (std::vector<std::string>{"a", "b", "c", "d"}));
  for (const auto& [name, t] : by_name) EXPECT_TRUE(torch::equal(sharded.read(name), t)) << name;

  EXPECT_EQ(write_hf_weights(out, specs, source, 1000), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_FALSE(files::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(files::exists(out + "/model-00001-of-00004.safetensors"));
  const HfWeights single(out);
  EXPECT_EQ(single.files(), (std::vector<std::string>{out + "/model.safetensors"}));
  EXPECT_TRUE(torch::equal(single.read("c"), by_name["c"]));
  const HfWeights file(out + "/model.safetensors");
  EXPECT_EQ(file.names().size(), 4u);
}

TEST(HfWeights, InconsistentDirectoriesAreClearErrors) {
  TempDir dir;
  const ExitCode code = ExitCode::kCheckpoint;
  expect_error([&] { HfWeights w(dir.path("")); }, code, {"neither model.safetensors.index.json nor model.safetensors"});
  write_safetensors(dir.path("s1.safetensors"), {{"a", torch::ones({2})}}, {});
  dir.write("model.safetensors.index.json", R"({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  expect_error([&] { HfWeights w(dir.path("")); }, code, {"maps tensor b to s1.safetensors, which does not hold it"});
  dir.write("model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error([&] { HfWeights w(dir.path("")); }, code, {"s2.safetensors: no such file"});
  write_safetensors(dir.path("s2.safetensors"), {{"a", torch::ones({2})}, {"b", torch::ones({1})}}, {});
  expect_error([&] { HfWeights w(dir.path("")); }, code, {"tensor a is in both"});
  dir.write("model.safetensors.index.json", "{\"weight_map\": [1, 2]}");
  expect_error([&] { HfWeights w(dir.path("")); }, code, {"model.safetensors.index.json", "weight_map"});
}

// config.json takes the keys of Hugging Face's DeepSeek-V3, V2 and Llama configurations.
TEST(HfConfig, NamesTheArchitectureAndItsKeys) {
  const HfConfig v3 = hf_config(preset("tiny-v3"), torch::kBFloat16);
  const nlohmann::json& j = v3.json;
  EXPECT_EQ(j["model_type"], "deepseek_v3");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"DeepseekV3ForCausalLM"}));
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["num_hidden_layers"], 3);
  EXPECT_EQ(j["num_attention_heads"], 4);
  EXPECT_EQ(j["num_key_value_heads"], 4);
  EXPECT_EQ(j["q_lora_rank"], 24);
  EXPECT_EQ(j["kv_lora_rank"], 16);
  EXPECT_EQ(j["qk_rope_head_dim"], 4);
  EXPECT_EQ(j["n_routed_experts"], 8);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["first_k_dense_replace"], 1);
  EXPECT_EQ(j["topk_method"], "noaux_tc");
  EXPECT_EQ(j["scoring_func"], "sigmoid");
  EXPECT_EQ(j["routed_scaling_factor"], 2.5);
  EXPECT_EQ(j["max_position_embeddings"], 64);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_TRUE(v3.warnings.empty());

  const nlohmann::json lite = hf_config(preset("deepseek-v2-lite"), torch::kFloat32).json;
  EXPECT_EQ(lite["model_type"], "deepseek_v2");
  EXPECT_TRUE(lite["q_lora_rank"].is_null());
  EXPECT_EQ(lite["topk_method"], "greedy");
  const nlohmann::json yarn =
      hf_config(preset("deepseek-v3", {"--model.rope_scaling_factor", "40", "--model.rope_mscale_all_dim", "1"}),
                torch::kBFloat16)
          .json;
  EXPECT_EQ(yarn["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(yarn["rope_scaling"]["factor"], 40.0);
  EXPECT_EQ(yarn["rope_scaling"]["original_max_position_embeddings"], 4096);
  EXPECT_EQ(yarn["rope_scaling"]["mscale_all_dim"], 1.0);
  EXPECT_EQ(yarn["num_nextn_predict_layers"], 1);

  const HfConfig dense = hf_config(preset("tiny"), torch::kFloat32);
  EXPECT_EQ(dense.json["model_type"], "llama");
  EXPECT_EQ(dense.json["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(dense.json["num_key_value_heads"], 2);
  EXPECT_EQ(dense.json["head_dim"], 8);
  EXPECT_FALSE(dense.json.contains("n_routed_experts"));
  EXPECT_TRUE(dense.warnings.empty());
  EXPECT_EQ(hf_config(preset("tiny", {"--model.rope_interleave", "true"}), torch::kFloat32).warnings.size(), 1u);
}

// Imports compare config.json with the configuration. DeepSeek-V2-Lite's published config.json
// differs from the pre-training preset in its YaRN extension alone, and the overrides it names
// make the two agree.
TEST(HfConfig, DifferencesNameWhatChangesTheLogitsAndTheOverridesThatAgree) {
  const nlohmann::json published = nlohmann::json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
    "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "use_cache": true, "v_head_dim": 128, "vocab_size": 102400})");
  const HfConfigDifferences pretraining = hf_config_differences(preset("deepseek-v2-lite"), published);
  EXPECT_EQ(pretraining.lines, (std::vector<std::string>{
                                   "rope_scaling.factor: 40 there, 1 here (model.rope_scaling_factor)",
                                   "rope_scaling.mscale: 0.707 there, 1 here (model.rope_mscale)",
                                   "rope_scaling.mscale_all_dim: 0.707 there, 0 here (model.rope_mscale_all_dim)"}));
  std::vector<std::string> overrides;
  for (const std::string& option : pretraining.overrides) {
    overrides.push_back(option.substr(0, option.find(' ')));
    overrides.push_back(option.substr(option.find(' ') + 1));
  }
  EXPECT_EQ(overrides, (std::vector<std::string>{"--model.rope_scaling_factor", "40", "--model.rope_mscale", "0.707",
                                                 "--model.rope_mscale_all_dim", "0.707"}));
  EXPECT_TRUE(hf_config_differences(preset("deepseek-v2-lite", overrides), published).lines.empty());

  // Every preset agrees with the config.json of its own export.
  for (const char* name : {"tiny", "tiny-v3", "deepseek-llm-7b", "deepseek-v2", "deepseek-v2-lite", "deepseek-v3"})
    EXPECT_TRUE(hf_config_differences(preset(name), hf_config(preset(name), torch::kBFloat16).json).lines.empty())
        << name;

  // What dstrain cannot compute is named without an override; RoPE's layout follows model_type.
  nlohmann::json other = published;
  other.erase("rope_scaling");
  other["attention_bias"] = true;
  other["q_lora_rank"] = 1536;
  const HfConfigDifferences differences =
      hf_config_differences(preset("deepseek-v2-lite", {"--model.rope_interleave", "false"}), other);
  EXPECT_EQ(differences.lines,
            (std::vector<std::string>{"q_lora_rank: 1536 there, none here (model.q_lora_rank)",
                                      "attention_bias: true there, false here (dstrain computes only the latter)",
                                      "rope_interleave (as model_type deepseek_v2 implies): true there, false here "
                                      "(model.rope_interleave)"}));
  EXPECT_EQ(differences.overrides, (std::vector<std::string>{"--model.q_lora_rank 1536", "--model.rope_interleave true"}));

  nlohmann::json linear = published;
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  EXPECT_EQ(hf_config_differences(preset("deepseek-v2-lite"), linear).lines,
            (std::vector<std::string>{"rope_scaling.type: linear there (dstrain computes YaRN or no scaling)"}));

  // DeepSeek-V2 ignores routed_scaling_factor when it renormalises the top-k weights; dstrain,
  // like V3, applies it: export warns, import asks for a factor of 1.
  nlohmann::json normalised = published;
  normalised["norm_topk_prob"] = true;
  normalised["routed_scaling_factor"] = 16.0;
  const ModelConfig lite = preset("deepseek-v2-lite", {"--model.norm_topk_prob", "true", "--model.rope_scaling_factor",
                                                       "40", "--model.rope_mscale", "0.707",
                                                       "--model.rope_mscale_all_dim", "0.707"});
  EXPECT_TRUE(hf_config_differences(lite, normalised).lines.empty());
  const ModelConfig scaled = preset("deepseek-v2-lite", {"--model.norm_topk_prob", "true", "--model.rope_scaling_factor",
                                                         "40", "--model.rope_mscale", "0.707",
                                                         "--model.rope_mscale_all_dim", "0.707",
                                                         "--model.routed_scaling_factor", "16"});
  EXPECT_EQ(hf_config_differences(scaled, normalised).lines,
            (std::vector<std::string>{"routed_scaling_factor (which deepseek_v2 ignores with norm_topk_prob): 1 there, "
                                      "16 here (model.routed_scaling_factor)"}));
  EXPECT_EQ(hf_config(scaled, torch::kFloat32).warnings.size(), 1u);
  EXPECT_TRUE(hf_config(lite, torch::kFloat32).warnings.empty());
}

// Multi-token prediction modules are the layers from num_hidden_layers on; the copies of the
// embedding and the head that Hugging Face's files keep for each are found by name.
TEST(HfNames, SharedCopiesOfMultiTokenPredictionModules) {
  EXPECT_EQ(parameter_layer("model.layers.12.mlp.gate.weight"), 12);
  EXPECT_EQ(parameter_layer("model.layers.x.mlp"), -1);
  EXPECT_EQ(parameter_layer("model.layers.3"), -1);
  EXPECT_EQ(parameter_layer("model.embed_tokens.weight"), -1);
  const std::vector<std::string> names = {"lm_head.weight", "model.embed_tokens.weight", "model.layers.2.enorm.weight",
                                          "model.layers.3.eh_proj.weight", "model.layers.3.hnorm.weight",
                                          "model.layers.1.mlp.gate.weight"};
  EXPECT_EQ(hf_shared_copies(names, 2),
            (std::vector<std::pair<std::string, std::string>>{
                {"model.layers.2.embed_tokens.weight", "model.embed_tokens.weight"},
                {"model.layers.2.shared_head.head.weight", "lm_head.weight"},
                {"model.layers.3.embed_tokens.weight", "model.embed_tokens.weight"},
                {"model.layers.3.shared_head.head.weight", "lm_head.weight"}}));
  EXPECT_TRUE(hf_shared_copies(names, 4).empty());
  EXPECT_EQ(hf_shared_original("model.layers.61.embed_tokens.weight", 61), "model.embed_tokens.weight");
  EXPECT_EQ(hf_shared_original("model.layers.61.shared_head.head.weight", 61), "lm_head.weight");
  EXPECT_EQ(hf_shared_original("model.layers.61.shared_head.norm.weight", 61), "");
  EXPECT_EQ(hf_shared_original("model.layers.60.embed_tokens.weight", 61), "");
}

// An import or export checks the files against the parameters computed from the configuration:
// the names and shapes of the built model, for every kind of layer.
TEST(HfNames, ParameterShapesAreTheBuiltModels) {
  std::vector<std::pair<std::string, ModelConfig>> configs = {{"tiny", preset("tiny")}, {"tiny-v3", preset("tiny-v3")}};
  ModelConfig gqa = preset("tiny");
  gqa.num_kv_heads = gqa.num_heads / 2;
  configs.emplace_back("grouped-query", gqa);
  ModelConfig v2 = preset("tiny-v3");  // V2-Lite's shape: no query compression, softmax, no bias
  v2.q_lora_rank = 0;
  v2.scoring_func = ScoringFunction::kSoftmax;
  v2.topk_method = TopkMethod::kGroupLimitedGreedy;
  v2.n_shared_experts = 2;
  v2.num_nextn_predict_layers = 0;
  configs.emplace_back("v2-like", v2);
  ModelConfig sparse = preset("tiny-v3");  // every other layer MoE, no shared expert, two MTP modules
  sparse.first_k_dense_replace = 0;
  sparse.moe_layer_freq = 2;
  sparse.n_shared_experts = 0;
  sparse.num_nextn_predict_layers = 2;
  configs.emplace_back("sparse", sparse);
  for (const auto& [name, config] : configs) {
    CausalLM whole(config, LayerSlice::whole(config));
    std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
    for (const auto& [param, t] : sorted_parameters(*whole)) expected.emplace_back(param, t.sizes().vec());
    EXPECT_EQ(parameter_shapes(config), expected) << name;
    // A bf16 model keeps fp32 exactly what gradients do not train (which has no fp32 master).
    cast_parameters(*whole, torch::kBFloat16);
    for (const auto& [param, t] : sorted_parameters(*whole)) {
      EXPECT_EQ(t.scalar_type(), t.requires_grad() ? torch::kBFloat16 : torch::kFloat32) << name << ": " << param;
      EXPECT_EQ(parameter_dtype(param, torch::kBFloat16), t.scalar_type()) << name << ": " << param;
    }
  }
}
