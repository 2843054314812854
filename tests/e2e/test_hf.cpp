// Hugging Face weights in and out: dstrain ckpt export-hf and import-hf from the command line,
// on a trained DeepSeek-V3-shaped model and on files written independently by a Python script.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/hf_config.h"
#include "dstrain/core/files.h"
#include "dstrain/model/parameter_shapes.h"
#include "dstrain/model/transformer.h"
#include "dstrain/train/train_config.h"
#include "e2e_util.h"

using namespace dstrain::e2e;
using dstrain::CheckpointReader;

namespace {

std::string input(const std::string& name) { return std::string(DSTRAIN_SOURCE_DIR) + "/input/" + name; }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// tiny-v3 for 6 steps on one rank, its checkpoint at the end; once per test process.
const std::string& trained_v3() {
  static const std::string dir = [] {
    const std::string d = scratch_dir("hf-v3-" + std::to_string(getpid()));
    RunOutput run = run_dstrain(1, {"train", "--config", input("tiny-v3.ini"), "--run.dir", d, "--data.train",
                                    test_corpus().train, "--train.device", "cpu", "--train.micro_batch", "1",
                                    "--train.global_batch", "8", "--train.steps", "6", "--ckpt.interval", "6"});
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return d;
  }();
  return dir;
}

// Every /model dataset of `b` has the name, dtype, shape and bytes of `a`'s.
void expect_same_model(const std::string& a, const std::string& b) {
  const CheckpointReader ra(a), rb(b);
  std::vector<std::string> names_a, names_b;
  for (const auto& d : ra.datasets())
    if (d.name.rfind("model/", 0) == 0) names_a.push_back(d.name);
  for (const auto& d : rb.datasets())
    if (d.name.rfind("model/", 0) == 0) names_b.push_back(d.name);
  ASSERT_EQ(names_a, names_b);
  ASSERT_GT(names_a.size(), 10u);
  for (const std::string& name : names_a) {
    const torch::Tensor x = ra.read(name), y = rb.read(name);
    ASSERT_EQ(x.scalar_type(), y.scalar_type()) << name;
    ASSERT_EQ(x.sizes(), y.sizes()) << name;
    EXPECT_EQ(std::string(static_cast<const char*>(x.data_ptr()), x.nbytes()),
              std::string(static_cast<const char*>(y.data_ptr()), y.nbytes()))
        << name;
  }
}

double eval_loss(const std::string& ckpt, const std::string& json) {
  RunOutput run = run_dstrain(0, {"eval", "--ckpt", ckpt, "--data", test_corpus().valid, "--batches", "2", "--json",
                                  json, "--train.device", "cpu"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return read_json(json)["loss"].get<double>();
}

std::string greedy_text(const std::string& ckpt) {
  RunOutput run = run_dstrain(0, {"generate", "--ckpt", ckpt, "--prompt", "The licensee", "--device", "cpu",
                                  "--temperature", "0", "--max-new-tokens", "20"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return run.output.substr(0, run.output.find("\ngenerated "));
}

// The model of an input/ configuration with `overrides`.
dstrain::ModelConfig model_of(const std::string& config, std::vector<std::string> overrides = {}) {
  dstrain::OptionTable table = dstrain::train_option_table();
  overrides.insert(overrides.begin(), {"--config", input(config)});
  return dstrain::read_model_config(dstrain::parse_command_line(table, overrides).options);
}

// The parameters of an input/ configuration, as the Python script's spec: each tensor with its
// shape and a dtype taken in turn from `dtypes`.
nlohmann::json spec_of(const std::string& config, const std::vector<std::string>& dtypes,
                       const std::vector<std::string>& overrides = {}) {
  const dstrain::ModelConfig model = model_of(config, overrides);
  nlohmann::json tensors = nlohmann::json::array();
  size_t i = 0;
  for (const auto& [name, shape] : dstrain::parameter_shapes(model))
    tensors.push_back({{"name", name}, {"dtype", dtypes[i++ % dtypes.size()]}, {"shape", shape}});
  return {{"tensors", tensors}};
}

// The Python script writes `spec` to `out` (a .safetensors file, or a directory of `shards`).
void make_safetensors(const std::string& dir, const nlohmann::json& spec, const std::string& out, int shards = 1) {
  const std::string spec_path = dir + "/spec-" + std::to_string(std::hash<std::string>()(out)) + ".json";
  std::ofstream(spec_path) << spec.dump();
  const std::string command = std::string(PYTHON3) + " " + DSTRAIN_SOURCE_DIR + "/tests/tools/make_safetensors.py " +
                              spec_path + " " + out + " --shards " + std::to_string(shards);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

// What the script puts in element k of the t-th tensor.
torch::Tensor script_values(int64_t t, const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  torch::Tensor k = torch::arange(count, torch::kInt64);
  return ((k * 7 + 3 * t).remainder(17) - 8).to(torch::kFloat32).div(16).reshape(shape);
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

// The tensors that carry weight_scale_inv in DeepSeek-V3's published model.safetensors.index.json:
// the projections of attention and of the MLPs, experts and shared experts.
bool deepseek_quantizes(const std::string& name) {
  return name.rfind("model.layers.", 0) == 0 && (contains(name, ".self_attn.") || contains(name, ".mlp.")) &&
         (ends_with(name, "_proj.weight") || ends_with(name, "_proj_with_mqa.weight"));
}

// E4M3 by its definition, in fp64: sign, 4 exponent bits with bias 7, 3 mantissa bits, exponent
// bits 0 subnormal (the script writes no NaN code).
double e4m3(int code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

// What the script puts in the t-th tensor when it is F8_E4M3 with scales in blocks of `block`:
// each code's value times its block's scale, in fp64.
torch::Tensor script_fp8_values(int64_t t, const std::vector<int64_t>& shape, const std::vector<int64_t>& block) {
  const int64_t rows = shape[0], cols = shape[1], scale_cols = (cols + block[1] - 1) / block[1];
  torch::Tensor out = torch::empty({rows, cols}, torch::kFloat64);
  double* v = out.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t k = r * cols + c, j = (r / block[0]) * scale_cols + c / block[1];
      int64_t code = (37 * k + 11 * t + 5) % 256;
      if ((code & 0x7F) == 0x7F) --code;
      const double scale = std::ldexp(1.0 + static_cast<double>((3 * j + t) % 8) / 8, static_cast<int>((j + t) % 5) - 2);
      v[k] = e4m3(static_cast<int>(code)) * scale;
    }
  return out;
}

// tiny-v3's parameters laid out as DeepSeek-V3 publishes its own: the projections F8_E4M3 with
// scales in blocks of `block`, the rest BF16.
nlohmann::json fp8_spec(const std::vector<int64_t>& block) {
  nlohmann::json spec = spec_of("tiny-v3.ini", {"BF16"});
  for (auto& tensor : spec["tensors"])
    if (deepseek_quantizes(tensor["name"])) {
      tensor["dtype"] = "F8_E4M3";
      tensor["block"] = block;
    }
  return spec;
}

nlohmann::json fp8_quantization(const std::vector<int64_t>& block) {
  return {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"}, {"weight_block_size", block}};
}

// tiny-v3's config.json in `dir`, with `quantization` as its quantization_config unless null.
void write_tiny_v3_config_json(const std::string& dir, const nlohmann::json& quantization) {
  nlohmann::json config = dstrain::hf_config(model_of("tiny-v3.ini"), torch::kBFloat16).json;
  if (!quantization.is_null()) config["quantization_config"] = quantization;
  std::ofstream(dir + "/config.json") << config.dump(2);
}

// The JSON header of a safetensors file.
nlohmann::json safetensors_header(const std::string& path) {
  const std::string bytes = file_bytes(path);
  if (bytes.size() < 8) return nlohmann::json();
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  return nlohmann::json::parse(bytes.substr(8, length));
}

// The largest magnitude of each `block` of a 2-D tensor, broadcast back over its elements.
torch::Tensor block_max(const torch::Tensor& weight, int64_t block) {
  torch::Tensor out = torch::empty_like(weight);
  for (int64_t r = 0; r < weight.size(0); r += block)
    for (int64_t c = 0; c < weight.size(1); c += block) {
      const torch::Tensor part = weight.slice(0, r, r + block).slice(1, c, c + block);
      out.slice(0, r, r + block).slice(1, c, c + block).fill_(part.abs().max());
    }
  return out;
}

}  // namespace

// A trained DeepSeek-V3-shaped model leaves and comes back bitwise; the re-export is the same
// bytes; the imported checkpoint evaluates, generates and fine-tunes as the original.
TEST(HfImportExport, ExportImportRoundTripIsBitwiseAndUsable) {
  const std::string run = trained_v3(), ckpt = run + "/checkpoints/step_00000006.h5";
  const std::string dir = scratch_dir("hf-roundtrip");
  RunOutput exported = run_dstrain(0, {"ckpt", "export-hf", run + "/checkpoints", "--output", dir + "/hf1"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(contains(exported.output, "model.safetensors config.json")) << exported.output;
  const nlohmann::json config = read_json(dir + "/hf1/config.json");
  EXPECT_EQ(config["model_type"], "deepseek_v3");
  EXPECT_EQ(config["architectures"][0], "DeepseekV3ForCausalLM");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["n_routed_experts"], 8);
  EXPECT_EQ(config["num_hidden_layers"], 3);
  EXPECT_EQ(config["num_nextn_predict_layers"], 1);
  {
    // The MTP module under V3's names, with the copies of the embedding and head V3 stores.
    const std::string bytes = file_bytes(dir + "/hf1/model.safetensors");
    ASSERT_GE(bytes.size(), 8u);
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, length));
    for (const char* name : {"model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight",
                             "model.layers.3.shared_head.norm.weight", "model.layers.3.embed_tokens.weight",
                             "model.layers.3.shared_head.head.weight"})
      EXPECT_TRUE(header.contains(name)) << name;
  }

  RunOutput imported = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf1", "--config", run + "/config.ini", "--output",
                                       dir + "/imported.h5"});
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  expect_same_model(ckpt, dir + "/imported.h5");
  // Without --config the model comes from config.json: MLA, the router, YaRN and the MTP module.
  RunOutput from_json = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf1", "--output", dir + "/from-json.h5"});
  ASSERT_EQ(from_json.exit_code, 0) << from_json.output;
  EXPECT_TRUE(contains(from_json.output, "the model of " + dir + "/hf1's config.json: --model.num_nextn_predict_layers 1"))
      << from_json.output;
  expect_same_model(ckpt, dir + "/from-json.h5");
  {
    const CheckpointReader reader(dir + "/imported.h5");
    EXPECT_EQ(reader.state().step, 0);
    EXPECT_TRUE(reader.verify().empty());
    for (const auto& d : reader.datasets()) EXPECT_NE(d.name.rfind("optim/", 0), 0u) << d.name;
  }
  // Exported again, by either route in, the same files (the balance loss's weight included).
  for (const char* route : {"imported", "from-json"}) {
    const std::string out = dir + "/hf-again-" + route;
    RunOutput again = run_dstrain(0, {"ckpt", "export-hf", dir + "/" + route + ".h5", "--output", out});
    ASSERT_EQ(again.exit_code, 0) << again.output;
    for (const char* file : {"model.safetensors", "config.json"})
      EXPECT_EQ(file_bytes(dir + "/hf1/" + file), file_bytes(out + "/" + file)) << route << ": " << file;
  }
  EXPECT_GT(config["aux_loss_alpha"].get<double>(), 0.0);

  // bf16 and sharded: every tensor rounded the same way whichever the route.
  RunOutput bf16 = run_dstrain(0, {"ckpt", "export-hf", ckpt, "--output", dir + "/hf-bf16", "--dtype", "bf16",
                                   "--max-shard-size", "20KB"});
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_TRUE(dstrain::files::exists(dir + "/hf-bf16/model.safetensors.index.json"));
  EXPECT_FALSE(dstrain::files::exists(dir + "/hf-bf16/model.safetensors"));
  EXPECT_EQ(read_json(dir + "/hf-bf16/config.json")["torch_dtype"], "bfloat16");
  RunOutput bf16_in = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf-bf16", "--config", run + "/config.ini",
                                      "--train.precision", "bf16", "--output", dir + "/imported-bf16.h5"});
  ASSERT_EQ(bf16_in.exit_code, 0) << bf16_in.output;
  {
    const CheckpointReader original(ckpt), rounded(dir + "/imported-bf16.h5");
    const torch::Tensor a = original.read("model/model.layers.1.mlp.experts.3.up_proj.weight");
    const torch::Tensor b = rounded.read("model/model.layers.1.mlp.experts.3.up_proj.weight");
    EXPECT_EQ(b.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(a.to(torch::kBFloat16), b));
    // The balancing bias stays fp32 through the bf16 export and import, as dstrain trains it.
    const std::string bias = "model/model.layers.1.mlp.gate.e_score_correction_bias";
    EXPECT_EQ(rounded.read(bias).scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(original.read(bias), rounded.read(bias)));
  }

  // The imported checkpoint is the model: the same loss.
  EXPECT_EQ(eval_loss(dir + "/imported.h5", dir + "/a.json"), eval_loss(ckpt, dir + "/b.json"));

  // Fine-tuning from it: the weights of the import start the run, bitwise those of the original.
  auto finetune = [&](const std::string& name, const std::string& weights, const std::string& steps) {
    return run_dstrain(1, {"train", "--config", input("tiny-v3.ini"), "--run.dir", dir + "/" + name, "--data.train",
                           test_corpus().train, "--train.device", "cpu", "--train.micro_batch", "1",
                           "--train.global_batch", "8", "--train.steps", steps, "--ckpt.interval", "4",
                           "--ckpt.load_weights", weights});
  };
  RunOutput tuned = finetune("tuned", dir + "/imported.h5", "4");
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_TRUE(contains(tuned.output, "starting from the weights of " + dir + "/imported.h5")) << tuned.output;
  RunOutput reference = finetune("tuned-from-original", run + "/checkpoints", "4");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  EXPECT_EQ(read_json(dir + "/tuned/summary.json")["param_digest"],
            read_json(dir + "/tuned-from-original/summary.json")["param_digest"]);
  // It learnt from the trained weights: its first batch (the run's first too) has a lower loss.
  EXPECT_LT(train_records(dir + "/tuned").front()["loss"].get<double>(),
            train_records(run).front()["loss"].get<double>() - 0.3);
  // Started again (a requeued job), it continues from its own checkpoint, not from the weights.
  RunOutput requeued = finetune("tuned", dir + "/imported.h5", "6");
  ASSERT_EQ(requeued.exit_code, 0) << requeued.output;
  EXPECT_TRUE(contains(requeued.output, "resuming from " + dir + "/tuned/checkpoints/step_00000004.h5"))
      << requeued.output;
  // An import holds no optimizer state: resuming it is refused, naming the way that works.
  RunOutput resumed = run_dstrain(1, {"train", "--config", input("tiny-v3.ini"), "--run.dir", dir + "/resumed",
                                      "--data.train", test_corpus().train, "--train.device", "cpu",
                                      "--ckpt.resume", dir + "/imported.h5"});
  EXPECT_EQ(resumed.exit_code, 4) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "ckpt.load_weights = " + dir + "/imported.h5")) << resumed.output;
}

// A dense model trained in bf16 goes out as a Llama-shaped bf16 model and comes back bitwise: it
// writes the same text.
TEST(HfImportExport, DenseBf16RoundTripGeneratesTheSameText) {
  const std::string dir = scratch_dir("hf-dense");
  RunOutput run = train_tiny(1, dir + "/run", {"--train.device", "cpu", "--train.precision", "bf16", "--train.steps",
                                               "4", "--ckpt.interval", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string ckpt = dir + "/run/checkpoints/step_00000004.h5";
  RunOutput exported = run_dstrain(0, {"ckpt", "export-hf", ckpt, "--output", dir + "/hf1"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const nlohmann::json config = read_json(dir + "/hf1/config.json");
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  RunOutput imported = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf1/model.safetensors", "--config",
                                       dir + "/run/config.ini", "--output", dir + "/imported.h5"});
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  expect_same_model(ckpt, dir + "/imported.h5");
  RunOutput again = run_dstrain(0, {"ckpt", "export-hf", dir + "/imported.h5", "--output", dir + "/hf2"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(file_bytes(dir + "/hf1/model.safetensors"), file_bytes(dir + "/hf2/model.safetensors"));
  EXPECT_EQ(greedy_text(dir + "/imported.h5"), greedy_text(ckpt));
  // Without --config, from config.json (grouped-query attention, Llama's RoPE layout); the
  // precision is the command line's.
  RunOutput from_json = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf1/model.safetensors", "--train.precision", "bf16",
                                        "--output", dir + "/from-json.h5"});
  ASSERT_EQ(from_json.exit_code, 0) << from_json.output;
  expect_same_model(ckpt, dir + "/from-json.h5");
  EXPECT_EQ(greedy_text(dir + "/from-json.h5"), greedy_text(ckpt));

  // In fp32 the export carries the fp32 master weights, not their bf16 rounding.
  RunOutput fp32 = run_dstrain(0, {"ckpt", "export-hf", ckpt, "--output", dir + "/hf-fp32", "--dtype", "fp32"});
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  RunOutput fp32_in = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf-fp32", "--config", dir + "/run/config.ini",
                                      "--train.precision", "fp32", "--output", dir + "/imported-fp32.h5"});
  ASSERT_EQ(fp32_in.exit_code, 0) << fp32_in.output;
  const CheckpointReader original(ckpt), full(dir + "/imported-fp32.h5");
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  const torch::Tensor master = original.read("optim/" + name + "/master");
  EXPECT_EQ(master.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(full.read("model/" + name), master));
  EXPECT_FALSE(torch::equal(master, master.to(torch::kBFloat16).to(torch::kFloat32)));  // it is more than bf16
}

// Files written by the Python standard library (BF16, F16 and F32 tensors, unsorted headers without
// padding, three shards and their index) import to exactly the values the script wrote.
TEST(HfImportExport, IndependentlyWrittenShardsImportToTheirValues) {
  const std::string dir = scratch_dir("hf-python");
  nlohmann::json spec = spec_of("tiny.ini", {"BF16", "F16", "F32"});
  const size_t parameters = spec["tensors"].size();
  // Multi-token prediction tensors that this configuration has no module for: skipped.
  spec["tensors"].push_back({{"name", "model.layers.2.embed_tokens.weight"}, {"dtype", "BF16"}, {"shape", {264, 32}}});
  spec["tensors"].push_back({{"name", "model.layers.2.enorm.weight"}, {"dtype", "BF16"}, {"shape", {32}}});
  make_safetensors(dir, spec, dir + "/hf", 3);
  ASSERT_TRUE(dstrain::files::exists(dir + "/hf/model-00003-of-00003.safetensors"));

  for (const std::string precision : {"fp32", "bf16"}) {
    const std::string out = dir + "/imported-" + precision + ".h5";
    RunOutput run = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf", "--config", input("tiny.ini"), "--output", out,
                                    "--train.precision", precision});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_TRUE(contains(run.output, "imported " + std::to_string(parameters) + " tensors")) << run.output;
    EXPECT_TRUE(contains(run.output, "skipped 2: model.layers.2.embed_tokens.weight model.layers.2.enorm.weight"))
        << run.output;
    const CheckpointReader reader(out);
    for (size_t t = 0; t < parameters; ++t) {
      const std::string name = spec["tensors"][t]["name"];
      const torch::Tensor stored = reader.read("model/" + name);
      EXPECT_EQ(stored.scalar_type(), precision == "fp32" ? torch::kFloat32 : torch::kBFloat16) << name;
      const auto shape = spec["tensors"][t]["shape"].get<std::vector<int64_t>>();
      EXPECT_TRUE(torch::equal(stored.to(torch::kFloat32), script_values(static_cast<int64_t>(t), shape))) << name;
    }
    EXPECT_EQ(reader.find("model/model.layers.2.enorm.weight"), nullptr);
  }
  RunOutput generated = run_dstrain(0, {"generate", "--ckpt", dir + "/imported-fp32.h5", "--prompt", "x", "--device",
                                        "cpu", "--max-new-tokens", "4"});
  EXPECT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_GT(eval_loss(dir + "/imported-bf16.h5", dir + "/eval.json"), 0.0);

  // One .safetensors file given directly works too.
  make_safetensors(dir, spec, dir + "/one.safetensors");
  RunOutput single = run_dstrain(0, {"ckpt", "import-hf", dir + "/one.safetensors", "--config", input("tiny.ini"),
                                     "--output", dir + "/single.h5"});
  ASSERT_EQ(single.exit_code, 0) << single.output;
  expect_same_model(dir + "/imported-fp32.h5", dir + "/single.h5");
}

// Files that do not fit the model, or are damaged, stop the import with exit code 4 and a message
// naming the file and tensor; nothing appears at --output, and an existing checkpoint there stays.
TEST(HfImportExport, BadFilesAreClearErrorsAndLeaveTheOutputAlone) {
  const std::string dir = scratch_dir("hf-errors");
  const nlohmann::json good = spec_of("tiny.ini", {"F32"});
  make_safetensors(dir, good, dir + "/good.safetensors");
  const std::string existing = dir + "/existing.h5";
  RunOutput first = run_dstrain(0, {"ckpt", "import-hf", dir + "/good.safetensors", "--config", input("tiny.ini"),
                                    "--output", existing});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string existing_bytes = file_bytes(existing);

  auto import = [&](const std::string& file, const std::string& output) {
    return run_dstrain(0, {"ckpt", "import-hf", file, "--config", input("tiny.ini"), "--output", output});
  };
  auto expect_refused = [&](const std::string& file, std::vector<std::string> parts) {
    for (const std::string& output : {existing, dir + "/new.h5"}) {
      RunOutput run = import(file, output);
      EXPECT_EQ(run.exit_code, 4) << run.output;
      for (const std::string& part : parts) EXPECT_TRUE(contains(run.output, part)) << part << "\n" << run.output;
      EXPECT_FALSE(dstrain::files::exists(output + ".tmp"));
    }
    EXPECT_FALSE(dstrain::files::exists(dir + "/new.h5"));
    EXPECT_EQ(file_bytes(existing), existing_bytes);
  };

  nlohmann::json missing = good;
  for (size_t i = 0; i < missing["tensors"].size(); ++i)
    if (missing["tensors"][i]["name"] == "model.norm.weight") missing["tensors"].erase(i);
  make_safetensors(dir, missing, dir + "/missing.safetensors");
  expect_refused(dir + "/missing.safetensors", {"missing.safetensors: no tensor model.norm.weight"});

  nlohmann::json wrong_shape = good;
  for (auto& t : wrong_shape["tensors"])
    if (t["name"] == "model.layers.1.mlp.down_proj.weight") t["shape"] = {32, 60};
  make_safetensors(dir, wrong_shape, dir + "/shape.safetensors");
  expect_refused(dir + "/shape.safetensors",
                 {"tensor model.layers.1.mlp.down_proj.weight has shape [32, 60]", "expects [32, 64]"});

  // FP8 weights without a config.json whose quantization_config gives their block size.
  nlohmann::json fp8 = good;
  fp8["tensors"][3]["dtype"] = "F8_E4M3";
  make_safetensors(dir, fp8, dir + "/fp8.safetensors");
  expect_refused(dir + "/fp8.safetensors", {"tensor " + fp8["tensors"][3]["name"].get<std::string>(), "F8_E4M3",
                                            "no config.json lies beside the weights"});

  nlohmann::json other = good;
  other["tensors"].push_back({{"name", "model.layers.0.self_attn.q_a_proj.weight"}, {"dtype", "F32"}, {"shape", {8, 32}}});
  make_safetensors(dir, other, dir + "/other.safetensors");
  expect_refused(dir + "/other.safetensors", {"tensor model.layers.0.self_attn.q_a_proj.weight is no parameter"});

  // A deeper model than the configuration's: its extra decoder layer is no multi-token prediction module.
  nlohmann::json deeper = good;
  for (const auto& t : good["tensors"]) {
    const std::string name = t["name"];
    if (name.rfind("model.layers.1.", 0) != 0) continue;
    nlohmann::json copy = t;
    copy["name"] = "model.layers.2." + name.substr(std::string("model.layers.1.").size());
    deeper["tensors"].push_back(copy);
  }
  make_safetensors(dir, deeper, dir + "/deeper.safetensors");
  expect_refused(dir + "/deeper.safetensors", {"deeper.safetensors: tensor model.layers.2.mlp.down_proj.weight is in "
                                               "decoder layer 2, beyond the configuration's model.num_layers = 2"});

  std::string bytes = file_bytes(dir + "/good.safetensors");
  std::string corrupt = bytes;
  corrupt[8] = '[';  // the header's opening brace
  std::ofstream(dir + "/corrupt.safetensors", std::ios::binary) << corrupt;
  expect_refused(dir + "/corrupt.safetensors", {"corrupt.safetensors: the header is not a JSON object"});
  std::ofstream(dir + "/truncated.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  expect_refused(dir + "/truncated.safetensors", {"truncated.safetensors: tensor", "beyond the end of the data"});
  std::ofstream(dir + "/length.safetensors", std::ios::binary) << std::string("\xff\xff\xff", 3) << bytes.substr(3);
  expect_refused(dir + "/length.safetensors", {"length.safetensors: the header length", "beyond the end"});
  expect_refused(dir + "/absent", {"absent: no such file or directory"});

  // A config.json beside the weights that describes another computation (here RoPE's base) is
  // refused before anything is written, naming the settings that would agree.
  std::string why;
  ASSERT_TRUE(dstrain::files::make_directories(dir + "/theta", &why)) << why;
  std::ofstream(dir + "/theta/model.safetensors", std::ios::binary) << file_bytes(dir + "/good.safetensors");
  std::ofstream(dir + "/theta/config.json") << R"({"model_type": "llama", "hidden_size": 32, "rope_theta": 500000,
                                                  "rope_scaling": null, "tie_word_embeddings": false})";
  for (const std::string& output : {existing, dir + "/new.h5"}) {
    RunOutput theta = import(dir + "/theta", output);
    EXPECT_EQ(theta.exit_code, 2) << theta.output;
    EXPECT_TRUE(contains(theta.output, dir + "/theta/config.json describes another model than the configuration's:\n"
                                       "  rope_theta: 500000 there, 10000 here (model.rope_theta)\n"
                                       "import with config.json's values: --model.rope_theta 500000"))
        << theta.output;
  }
  EXPECT_FALSE(dstrain::files::exists(dir + "/new.h5"));
  EXPECT_EQ(file_bytes(existing), existing_bytes);
  RunOutput agreed = run_dstrain(0, {"ckpt", "import-hf", dir + "/theta", "--config", input("tiny.ini"),
                                     "--model.rope_theta", "500000", "--output", dir + "/theta.h5"});
  EXPECT_EQ(agreed.exit_code, 0) << agreed.output;

  RunOutput no_config = run_dstrain(0, {"ckpt", "import-hf", dir + "/good.safetensors", "--output", dir + "/x.h5"});
  EXPECT_EQ(no_config.exit_code, 2) << no_config.output;
  EXPECT_TRUE(contains(no_config.output, "no config.json beside " + dir + "/good.safetensors to take the model from; "
                                         "give --config FILE.ini")) << no_config.output;
  RunOutput bad_dtype = run_dstrain(0, {"ckpt", "export-hf", existing, "--output", dir + "/out", "--dtype", "fp4"});
  EXPECT_EQ(bad_dtype.exit_code, 2) << bad_dtype.output;
  EXPECT_TRUE(contains(bad_dtype.output, "--dtype = fp4")) << bad_dtype.output;
  RunOutput onto_file = run_dstrain(0, {"ckpt", "export-hf", existing, "--output", existing});
  EXPECT_EQ(onto_file.exit_code, 2) << onto_file.output;
  EXPECT_TRUE(contains(onto_file.output, "--output = " + existing + ": cannot create this directory")) << onto_file.output;
  EXPECT_EQ(file_bytes(existing), existing_bytes);
  RunOutput no_ckpt = run_dstrain(0, {"ckpt", "export-hf", dir + "/none.h5", "--output", dir + "/out"});
  EXPECT_EQ(no_ckpt.exit_code, 4) << no_ckpt.output;
  EXPECT_FALSE(dstrain::files::exists(dir + "/out"));

  // Damage found while writing: the directories the command made go again, with nothing in them.
  const std::string damaged = dir + "/damaged.h5";
  std::ofstream(damaged, std::ios::binary) << existing_bytes;
  flip_a_byte(damaged, "/model/model.norm.weight");
  RunOutput damaged_export = run_dstrain(0, {"ckpt", "export-hf", damaged, "--output", dir + "/fresh/hf"});
  EXPECT_EQ(damaged_export.exit_code, 4) << damaged_export.output;
  EXPECT_TRUE(contains(damaged_export.output, "model.norm.weight: the data do not match the checksum"))
      << damaged_export.output;
  EXPECT_FALSE(dstrain::files::exists(dir + "/fresh"));
  RunOutput truncated_import = import(dir + "/truncated.safetensors", dir + "/fresh/sub/new.h5");
  EXPECT_EQ(truncated_import.exit_code, 4) << truncated_import.output;
  EXPECT_FALSE(dstrain::files::exists(dir + "/fresh"));
}

// DeepSeek-V3's FP8 layout written by the Python script (codes and scales in blocks of 16 × 12, so
// that tiny-v3's shapes end in partial blocks both ways; two shards, so that scales may lie in
// another file than their weights) imports to each code's value times its block's scale as fp64
// computes it, rounded once; the scales are consumed with their weights, not imported.
// Only the multi-token prediction layers that the configuration does not build are skipped: in
// one it builds, a tensor that is no parameter means another model, as in any other layer.
TEST(HfImportExport, AnUnknownTensorInABuiltPredictionLayerIsRefused) {
  const std::string dir = scratch_dir("hf-mtp-extra");
  nlohmann::json spec = spec_of("tiny-v3.ini", {"F32"});
  spec["tensors"].push_back(
      {{"name", "model.layers.3.mlp.experts.9.gate_proj.weight"}, {"dtype", "F32"}, {"shape", {16, 32}}});
  make_safetensors(dir, spec, dir + "/extra.safetensors");
  RunOutput run = run_dstrain(0, {"ckpt", "import-hf", dir + "/extra.safetensors", "--config", input("tiny-v3.ini"),
                                  "--output", dir + "/imported.h5"});
  EXPECT_EQ(run.exit_code, 4) << run.output;
  EXPECT_TRUE(contains(run.output, "tensor model.layers.3.mlp.experts.9.gate_proj.weight is no parameter"))
      << run.output;
  EXPECT_FALSE(dstrain::files::exists(dir + "/imported.h5"));
}

TEST(HfImportExport, Fp8BlockScaledWeightsImportToCodeTimesScale) {
  const std::string dir = scratch_dir("hf-fp8");
  const std::vector<int64_t> block = {16, 12};
  const nlohmann::json spec = fp8_spec(block);
  make_safetensors(dir, spec, dir + "/hf", 2);
  write_tiny_v3_config_json(dir + "/hf", fp8_quantization(block));
  size_t quantized = 0;
  for (const auto& tensor : spec["tensors"]) quantized += tensor["dtype"] == "F8_E4M3";
  ASSERT_EQ(quantized, 104u);  // 4 attention layers × 5, a dense MLP's 3, 3 MoE layers × 9 experts × 3
  for (const std::string precision : {"fp32", "bf16"}) {
    const std::string out = dir + "/imported-" + precision + ".h5";
    // The model from config.json, whose quantization_config gives the block size.
    RunOutput run = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf", "--train.precision", precision, "--output", out});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_TRUE(contains(run.output, "imported " + std::to_string(spec["tensors"].size()) + " tensors")) << run.output;
    EXPECT_FALSE(contains(run.output, "skipped")) << run.output;
    const CheckpointReader reader(out);
    for (size_t t = 0; t < spec["tensors"].size(); ++t) {
      const nlohmann::json& tensor = spec["tensors"][t];
      const std::string name = tensor["name"];
      const auto shape = tensor["shape"].get<std::vector<int64_t>>();
      const int64_t index = static_cast<int64_t>(t);
      const torch::Tensor expected =
          tensor["dtype"] == "F8_E4M3" ? script_fp8_values(index, shape, block) : script_values(index, shape);
      const torch::Tensor stored = reader.read("model/" + name);
      EXPECT_TRUE(torch::equal(stored, expected.to(torch::kFloat32).to(stored.scalar_type()))) << name;
      EXPECT_EQ(reader.find("model/" + name + "_scale_inv"), nullptr) << name;
    }
  }
  RunOutput with_config = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf", "--config", input("tiny-v3.ini"), "--output",
                                          dir + "/with-config.h5"});
  ASSERT_EQ(with_config.exit_code, 0) << with_config.output;
  expect_same_model(dir + "/imported-fp32.h5", dir + "/with-config.h5");
}

// Scales that are missing, of another shape (or of another block size than config.json's), not
// finite or not positive, and FP8 weights without a quantization_config to read them by: exit
// code 4 with a message naming the tensor; nothing appears at --output, an existing file stays.
TEST(HfImportExport, DamagedFp8ScalesAreClearErrorsAndLeaveTheOutputAlone) {
  const std::string dir = scratch_dir("hf-fp8-errors");
  const std::vector<int64_t> block = {16, 12};
  const nlohmann::json good = fp8_spec(block);
  // Each case: a directory with the files and config.json.
  auto make_case = [&](const std::string& name, const nlohmann::json& spec, const nlohmann::json& quantization) {
    const std::string d = dir + "/" + name;
    std::string why;
    EXPECT_TRUE(dstrain::files::make_directories(d, &why)) << why;
    make_safetensors(dir, spec, d + "/model.safetensors");
    write_tiny_v3_config_json(d, quantization);
    return d;
  };
  const std::string existing = dir + "/existing.h5";
  RunOutput first = run_dstrain(0, {"ckpt", "import-hf", make_case("good", good, fp8_quantization(block)), "--config",
                                    input("tiny-v3.ini"), "--output", existing});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string existing_bytes = file_bytes(existing);
  auto expect_refused = [&](const std::string& source, std::vector<std::string> parts) {
    for (const std::string& output : {existing, dir + "/new.h5"}) {
      RunOutput run = run_dstrain(0, {"ckpt", "import-hf", source, "--config", input("tiny-v3.ini"), "--output", output});
      EXPECT_EQ(run.exit_code, 4) << run.output;
      for (const std::string& part : parts) EXPECT_TRUE(contains(run.output, part)) << part << "\n" << run.output;
      EXPECT_FALSE(dstrain::files::exists(output + ".tmp"));
    }
    EXPECT_FALSE(dstrain::files::exists(dir + "/new.h5"));
    EXPECT_EQ(file_bytes(existing), existing_bytes);
  };
  // `spec` with `key` of tensor `name` set to `value` (removed when null).
  auto changed = [&](const std::string& name, const std::string& key, const nlohmann::json& value) {
    nlohmann::json spec = good;
    for (auto& tensor : spec["tensors"])
      if (tensor["name"] == name) {
        if (value.is_null()) tensor.erase(key);
        else tensor[key] = value;
      }
    return spec;
  };

  const std::string down = "model.layers.1.mlp.experts.3.down_proj.weight";
  expect_refused(make_case("missing", changed(down, "block", nullptr), fp8_quantization(block)),
                 {"model.safetensors: tensor " + down + " is F8_E4M3, and no file holds its scales " + down + "_scale_inv"});
  const std::string q_b = "model.layers.0.self_attn.q_b_proj.weight";
  expect_refused(make_case("shape", changed(q_b, "scale_shape", {2, 2}), fp8_quantization(block)),
                 {"tensor " + q_b + "_scale_inv has shape [2, 2]; " + q_b + " [48, 24] in blocks of [16, 12]",
                  "needs [3, 2]"});
  const std::string o = "model.layers.2.self_attn.o_proj.weight";
  expect_refused(make_case("nan", changed(o, "scale_first", "nan"), fp8_quantization(block)),
                 {"tensor " + o + "_scale_inv: element [0, 0] is nan"});
  const std::string up = "model.layers.2.mlp.shared_experts.up_proj.weight";
  expect_refused(make_case("inf", changed(up, "scale_first", "inf"), fp8_quantization(block)),
                 {"tensor " + up + "_scale_inv: element [0, 0] is infinite"});
  const std::string gate = "model.layers.0.mlp.gate_proj.weight";
  expect_refused(make_case("zero", changed(gate, "scale_first", "0"), fp8_quantization(block)),
                 {"tensor " + gate + "_scale_inv: element [0, 0] is 0"});
  expect_refused(make_case("negative", changed(gate, "scale_first", "-1"), fp8_quantization(block)),
                 {"tensor " + gate + "_scale_inv: element [0, 0] is -1"});
  // Scales of 16 × 12 blocks read as 16 × 16 ones: every tensor whose columns that changes.
  expect_refused(make_case("block", good, fp8_quantization({16, 16})),
                 {"tensors cannot be imported", "in blocks of [16, 16] (config.json's quantization_config.weight_block_size)"});
  expect_refused(make_case("no-quantization", good, nullptr),
                 {"is F8_E4M3 (and 103 more), but " + dir + "/no-quantization/config.json has no quantization_config"});
  nlohmann::json e5m2 = fp8_quantization(block);
  e5m2["fmt"] = "e5m2";
  expect_refused(make_case("e5m2", good, e5m2),
                 {dir + "/e5m2/config.json: quantization_config.fmt is \"e5m2\""});
}

// export-hf --dtype fp8 writes DeepSeek-V3's layout: the projections F8_E4M3 with one F32 scale per
// 128 × 128 block (a model wider than a block: partial blocks both ways), the rest BF16 (the
// balancing bias F32), config.json's quantization_config; imported again, each weight is within
// E4M3's rounding of its block's largest magnitude. A trained model so exported still evaluates
// to within 1% of its loss.
TEST(HfImportExport, Fp8ExportIsDeepSeeksLayoutAndImportsBackWithinRounding) {
  const std::string dir = scratch_dir("hf-fp8-export");
  const std::vector<std::string> wide = {"--model.hidden_size", "136", "--model.intermediate_size", "200",
                                         "--model.moe_intermediate_size", "130", "--model.q_lora_rank", "40"};
  const nlohmann::json spec = spec_of("tiny-v3.ini", {"F32"}, wide);
  make_safetensors(dir, spec, dir + "/source.safetensors");
  std::vector<std::string> import = {"ckpt", "import-hf", dir + "/source.safetensors", "--config", input("tiny-v3.ini"),
                                     "--output", dir + "/original.h5"};
  import.insert(import.end(), wide.begin(), wide.end());
  RunOutput imported = run_dstrain(0, import);
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  RunOutput exported = run_dstrain(0, {"ckpt", "export-hf", dir + "/original.h5", "--output", dir + "/fp8", "--dtype", "fp8"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(contains(exported.output, "fp8 e4m3 in 128x128 blocks, the rest bf16")) << exported.output;

  const nlohmann::json config = read_json(dir + "/fp8/config.json");
  EXPECT_EQ(config["quantization_config"], nlohmann::json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "weight_block_size": [128, 128]})"));
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  const nlohmann::json header = safetensors_header(dir + "/fp8/model.safetensors");
  size_t scales = 0;
  for (const auto& [name, record] : header.items()) scales += ends_with(name, "_scale_inv");
  const dstrain::ModelConfig model = model_of("tiny-v3.ini", wide);
  size_t quantized = 0;
  for (const auto& [name, shape] : dstrain::parameter_shapes(model)) {
    ASSERT_TRUE(header.contains(name)) << name;
    if (!deepseek_quantizes(name)) {
      EXPECT_EQ(header[name]["dtype"], ends_with(name, "e_score_correction_bias") ? "F32" : "BF16") << name;
      EXPECT_FALSE(header.contains(name + "_scale_inv")) << name;
      continue;
    }
    ++quantized;
    EXPECT_EQ(header[name]["dtype"], "F8_E4M3") << name;
    EXPECT_EQ(header[name]["shape"], shape) << name;
    ASSERT_TRUE(header.contains(name + "_scale_inv")) << name;
    EXPECT_EQ(header[name + "_scale_inv"]["dtype"], "F32") << name;
    EXPECT_EQ(header[name + "_scale_inv"]["shape"],
              (std::vector<int64_t>{(shape[0] + 127) / 128, (shape[1] + 127) / 128})) << name;
  }
  EXPECT_EQ(scales, quantized);
  EXPECT_EQ(header["model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv"]["shape"], (std::vector<int64_t>{2, 2}));
  for (const char* name : {"model.layers.3.embed_tokens.weight", "model.layers.3.shared_head.head.weight",
                           "model.layers.3.eh_proj.weight", "model.layers.1.mlp.gate.weight"})
    EXPECT_EQ(header[name]["dtype"], "BF16") << name;

  RunOutput back = run_dstrain(0, {"ckpt", "import-hf", dir + "/fp8", "--output", dir + "/back.h5"});
  ASSERT_EQ(back.exit_code, 0) << back.output;
  const CheckpointReader original(dir + "/original.h5"), restored(dir + "/back.h5");
  for (const auto& [name, shape] : dstrain::parameter_shapes(model)) {
    const torch::Tensor a = original.read("model/" + name), b = restored.read("model/" + name);
    if (!deepseek_quantizes(name)) {
      EXPECT_TRUE(torch::equal(b, a.to(dstrain::parameter_dtype(name, torch::kBFloat16)).to(torch::kFloat32))) << name;
      continue;
    }
    const torch::Tensor error = (b.to(torch::kFloat64) - a.to(torch::kFloat64)).abs();
    EXPECT_TRUE(error.le(block_max(a, 128).to(torch::kFloat64) / 16).all().item<bool>()) << name;
  }

  // A trained model in FP8 evaluates to within 1% of its loss.
  const std::string run = trained_v3();
  RunOutput trained = run_dstrain(0, {"ckpt", "export-hf", run + "/checkpoints", "--output", dir + "/trained", "--dtype", "fp8"});
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  RunOutput trained_back = run_dstrain(0, {"ckpt", "import-hf", dir + "/trained", "--output", dir + "/trained.h5"});
  ASSERT_EQ(trained_back.exit_code, 0) << trained_back.output;
  const double fp8_loss = eval_loss(dir + "/trained.h5", dir + "/fp8.json");
  const double loss = eval_loss(run + "/checkpoints/step_00000006.h5", dir + "/fp32.json");
  EXPECT_NEAR(fp8_loss, loss, 0.01 * loss);
}
