// Hugging Face safetensors into a new checkpoint and a checkpoint's model out as safetensors with
// its config.json (hf_conversion.h).
#include "dstrain/ckpt/hf_conversion.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/hf_config.h"
#include "dstrain/ckpt/hf_fp8.h"
#include "dstrain/ckpt/hf_weights.h"
#include "dstrain/ckpt/model_shape.h"
#include "dstrain/ckpt/training_checkpoint.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/text.h"
#include "dstrain/model/parameter_shapes.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;
const std::string kLayers = "model.layers.";

bool readable_dtype(const std::string& dtype) { return dtype == "BF16" || dtype == "F16" || dtype == "F32"; }

// One message for the problems found, the first ones in full.
Error import_error(const std::vector<std::string>& problems) {
  if (problems.size() == 1) return Error(kCode, problems[0]);
  std::string message = std::to_string(problems.size()) + " tensors cannot be imported into the configuration's model:";
  for (size_t i = 0; i < problems.size() && i < 8; ++i) message += "\n  " + problems[i];
  if (problems.size() > 8) message += "\n  ... and " + std::to_string(problems.size() - 8) + " more";
  return Error(kCode, message);
}

// The config.json beside Hugging Face weights: `json` when there is one.
struct ConfigJson {
  std::string path;
  std::optional<nlohmann::json> json;
};

ConfigJson config_json_beside(const std::string& source) {
  ConfigJson config;
  config.path = hf_config_json_path(source);
  if (files::is_regular_file(config.path)) config.json = read_hf_config_json(config.path);
  return config;
}

// The config.json beside Hugging Face weights, when there is one, must describe the computation
// of the configuration's model: weights read into another (without the YaRN scaling they were
// extended with, say) would give other logits.
void check_config_json(const ConfigJson& config, const ModelConfig& model) {
  if (!config.json) return;
  const std::string& path = config.path;
  const HfConfigDifferences differences = hf_config_differences(model, *config.json);
  if (differences.lines.empty()) return;
  std::string message = path + " describes another model than the configuration's:";
  for (const std::string& line : differences.lines) message += "\n  " + line;
  if (!differences.overrides.empty()) {
    message += "\nimport with config.json's values:";
    for (const std::string& option : differences.overrides) message += " " + option;
  }
  throw Error(ExitCode::kUsage, message);
}

// How the tensors of Hugging Face files map onto the configuration's model.
struct ImportPlan {
  std::vector<std::string> problems;  // each a reason the files do not fit the model
  std::vector<std::string> skipped;   // tensors of the files left out
  std::vector<std::pair<std::string, std::string>> copies;  // {shared copy, original}: to compare
  int64_t unbuilt = 0;  // tensors of multi-token prediction layers the model does not have
  std::optional<Fp8BlockSize> fp8;  // config.json's, when parameters are stored F8_E4M3
};

using ParameterShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// F8_E4M3 parameters are read in blocks of the size that config.json's quantization_config gives
// (the scales' shape alone cannot tell a block size from a damaged scale): plan.fp8, or a problem
// when it gives none.
void plan_fp8(const HfWeights& weights, const ConfigJson& config, const ParameterShapes& shapes, ImportPlan& plan) {
  std::vector<std::string> fp8;
  for (const auto& [name, shape] : shapes)
    if (const SafetensorsEntry* e = weights.find(name); e && e->dtype == kSafetensorsE4M3) fp8.push_back(name);
  if (fp8.empty()) return;
  if (config.json) plan.fp8 = hf_fp8_block_size(*config.json, config.path);
  if (plan.fp8) return;
  plan.problems.push_back(
      weights.file_of(fp8[0]) + ": tensor " + fp8[0] + " is " + kSafetensorsE4M3 +
      (fp8.size() > 1 ? " (and " + std::to_string(fp8.size() - 1) + " more)" : "") + ", but " +
      (config.json ? config.path + " has no quantization_config" : "no config.json lies beside the weights") +
      " to give the block size of its scales (DeepSeek's: \"quantization_config\": {\"quant_method\": \"fp8\", "
      "\"fmt\": \"e4m3\", \"weight_block_size\": [128, 128]})");
}

// A parameter as the files hold it: FP8 weights times their scales, in float32.
torch::Tensor read_parameter(const HfWeights& weights, const std::string& name, const std::optional<Fp8BlockSize>& fp8) {
  const SafetensorsEntry* e = weights.find(name);
  if (fp8 && e && e->dtype == kSafetensorsE4M3) return read_hf_fp8(weights, name, *fp8);
  return weights.read(name);
}

// Every parameter must be in the files, with its shape and a dtype dstrain reads; FP8 ones with
// scales of the right shape and values.
void check_parameters(const HfWeights& weights, const std::string& source, const ParameterShapes& shapes,
                      ImportPlan& plan) {
  for (const auto& [name, shape] : shapes) {
    const SafetensorsEntry* e = weights.find(name);
    if (!e)
      plan.problems.push_back(source + ": no tensor " + name + " (shape " + shape_text(shape) +
                              " in the configuration's model)");
    else if (e->shape != shape)
      plan.problems.push_back(weights.file_of(name) + ": tensor " + name + " has shape " + shape_text(e->shape) +
                              "; the configuration's model expects " + shape_text(shape));
    else if (e->dtype == kSafetensorsE4M3) {
      const std::string problem = plan.fp8 ? hf_fp8_problem(weights, name, *plan.fp8) : "";  // else plan_fp8's
      if (!problem.empty()) plan.problems.push_back(problem);
    } else if (!readable_dtype(e->dtype)) {
      plan.problems.push_back(weights.file_of(name) + ": tensor " + name + " has dtype " + e->dtype +
                              "; dstrain reads BF16, F16, F32 and block-scaled F8_E4M3");
    }
  }
}

// The tensors of the files that are no parameter: copies of shared tensors and layers the model
// does not build are skipped, anything else means the files hold another model.
void sort_other_tensors(const HfWeights& weights, const ModelConfig& model, const ParameterShapes& shapes,
                        ImportPlan& plan) {
  std::set<std::string> parameters;
  std::set<int64_t> layers;  // the model's, multi-token prediction modules included
  for (const auto& [name, shape] : shapes) {
    parameters.insert(name);
    layers.insert(parameter_layer(name));
  }
  // DeepSeek-V3 files keep their multi-token prediction modules as layers after the decoder's;
  // tensors of their own tell them from decoder layers that the configuration lacks.
  auto is_mtp_layer = [&](int64_t layer) {
    for (const char* own : {"enorm.weight", "hnorm.weight", "eh_proj.weight"})
      if (weights.find(kLayers + std::to_string(layer) + "." + own)) return true;
    return false;
  };
  for (const std::string& name : weights.names()) {
    if (parameters.count(name)) continue;
    const std::string scaled = hf_scaled_weight(name);
    if (!scaled.empty() && parameters.count(scaled)) {
      const std::string dtype = weights.find(scaled) ? weights.find(scaled)->dtype : "";
      if (dtype == kSafetensorsE4M3) continue;  // the scales of an FP8 parameter, consumed with it
      if (!dtype.empty())
        plan.problems.push_back(weights.file_of(name) + ": tensor " + name + " scales " + scaled + ", which is " +
                                dtype + ", not " + kSafetensorsE4M3 + " (a file of a half-converted model?)");
      continue;
    }
    const std::string original = hf_shared_original(name, model.num_layers);
    const int64_t layer = parameter_layer(name);
    if (!original.empty() && layers.count(layer)) {
      plan.copies.emplace_back(name, original);
    } else if (ends_with(name, "rotary_emb.inv_freq")) {
      // a buffer older files carry; dstrain computes its rotary tables
    } else if (layer >= model.num_layers && !layers.count(layer) && is_mtp_layer(layer)) {
      ++plan.unbuilt;
    } else if (layer >= model.num_layers && !layers.count(layer)) {
      plan.problems.push_back(weights.file_of(name) + ": tensor " + name + " is in decoder layer " +
                              std::to_string(layer) + ", beyond the configuration's model.num_layers = " +
                              std::to_string(model.num_layers) + " (a deeper model?)");
      continue;
    } else {
      plan.problems.push_back(weights.file_of(name) + ": tensor " + name +
                              " is no parameter of the configuration's model (a file of another model, or another "
                              "configuration?)");
      continue;
    }
    plan.skipped.push_back(name);
  }
}

// What an import that fits leaves out, said: copies that differ from what the model shares, and
// the multi-token prediction layers it does not build.
std::vector<std::string> import_warnings(const HfWeights& weights, const ImportPlan& plan, int64_t num_layers) {
  std::vector<std::string> warnings;
  for (const auto& [copy, original] : plan.copies) {
    const torch::Tensor a = read_parameter(weights, copy, plan.fp8), b = read_parameter(weights, original, plan.fp8);
    // Compared in the files' dtype when they share it: no float32 copies of the largest tensors.
    const bool same = a.sizes().equals(b.sizes()) && (a.scalar_type() == b.scalar_type()
                                                          ? a.equal(b)
                                                          : a.to(torch::kFloat32).equal(b.to(torch::kFloat32)));
    if (!same)
      warnings.push_back("tensor " + copy + " differs from " + original +
                         ", which the multi-token prediction module shares in dstrain: " + original + " is kept");
  }
  if (plan.unbuilt > 0)
    warnings.push_back("skipped " + std::to_string(plan.unbuilt) + " tensor(s) of multi-token prediction layers " +
                       "(model.layers." + std::to_string(num_layers) +
                       " on) that the configuration's model does not have");
  return warnings;
}

// The /trainer of an imported checkpoint: what a run of the configuration records at step 0 on
// one rank.
CheckpointState imported_state(const HfImportSettings& settings) {
  CheckpointState state;
  state.step = 0;
  state.seq_len = settings.seq_len;
  state.global_batch = settings.global_batch;
  state.config = settings.config;
  state.model_shape = model_shape_text(settings.model);
  state.schedule = settings.schedule;
  state.stage_layers = std::to_string(settings.model.num_layers);
  state.rng = at::make_generator<at::CPUGeneratorImpl>(settings.seed).get_state().reshape({1, -1});
  return state;
}

// Writes every parameter, converted to result.dtype, into the checkpoint `output`, counting them
// in `result`. The directories made for it go again when it fails.
void write_imported(const std::string& output, const HfWeights& weights, const ImportPlan& plan,
                    const ParameterShapes& shapes, const CheckpointState& state, HfImportResult& result) {
  std::vector<std::string> names;
  for (const auto& [name, shape] : shapes) names.push_back(name);
  std::string why;
  std::vector<std::string> made_directories;  // removed again, if empty, when the import fails
  if (!files::make_parent_directories(output, &why, &made_directories))
    throw config_error("--output", output, "cannot create its directory (" + why + ")");
  try {
    write_model_checkpoint(
        output, names,
        [&](const std::string& name) {
          torch::Tensor t = read_parameter(weights, name, plan.fp8).to(parameter_dtype(name, result.dtype));
          ++result.tensors;
          result.bytes += static_cast<int64_t>(t.nbytes());
          return t;
        },
        state);
  } catch (...) {
    files::remove_empty_directories(made_directories);
    throw;
  }
}

// A checkpoint's /model datasets by parameter name.
using StoredParameters = std::map<std::string, const CheckpointReader::DatasetInfo*>;

// The checkpoint's parameters, which must be those of `model`: config.json describes those.
StoredParameters stored_parameters(const CheckpointReader& reader, const ModelConfig& model) {
  const std::string& checkpoint = reader.path();
  StoredParameters stored;
  for (const CheckpointReader::DatasetInfo& d : reader.datasets())
    if (d.name.compare(0, 6, "model/") == 0) stored[d.name.substr(6)] = &d;
  const ParameterShapes shapes = parameter_shapes(model);
  for (const auto& [name, shape] : shapes) {
    auto it = stored.find(name);
    if (it == stored.end())
      throw Error(kCode, checkpoint + ": no dataset /model/" + name + ", which the model of its configuration has");
    if (it->second->shape != shape)
      throw Error(kCode, checkpoint + ": /model/" + name + " has shape " + shape_text(it->second->shape) +
                             "; the model of its configuration has " + shape_text(shape));
  }
  if (stored.size() != shapes.size())
    for (const auto& [name, info] : stored)
      if (!std::binary_search(shapes.begin(), shapes.end(), std::make_pair(name, info->shape)))
        throw Error(kCode, checkpoint + ": /model/" + name + " is no parameter of the model of its configuration");
  return stored;
}

// Where a tensor of an export comes from: a parameter's values in a dtype, or its FP8 codes or
// scales.
struct ExportSource {
  enum class Part { kValues, kCodes, kScales };
  std::string parameter;
  Part part = Part::kValues;
  torch::ScalarType dtype = torch::kFloat32;  // of kValues
};
using ExportSources = std::map<std::string, ExportSource>;  // by tensor written

// A parameter that DeepSeek quantizes, as FP8 codes and their scales (hf_fp8.h).
void add_fp8_specs(const std::string& name, const std::vector<int64_t>& shape, Fp8BlockSize block,
                   std::vector<SafetensorsSpec>& specs, ExportSources& sources) {
  specs.push_back({name, torch::kUInt8, shape, /*e4m3=*/true});
  sources[name] = {name, ExportSource::Part::kCodes};
  const std::string scale = hf_scale_name(name);
  specs.push_back({scale, torch::kFloat32, fp8_scale_shape(shape, block)});
  sources[scale] = {name, ExportSource::Part::kScales};
}

// The tensors of an export: every parameter in the format's dtype (or as stored; FP8 with its
// scales where the format quantizes it), then the copies a Hugging Face file keeps of what
// multi-token prediction modules share.
std::vector<SafetensorsSpec> export_specs(const std::string& checkpoint, const StoredParameters& stored,
                                          const HfExportFormat& format, int64_t num_layers, ExportSources& sources) {
  // Beside FP8 weights the rest is BF16, as in DeepSeek's files.
  const std::optional<torch::ScalarType> dtype = format.fp8 ? torch::kBFloat16 : format.dtype;
  std::vector<SafetensorsSpec> specs;
  std::vector<std::string> names;
  for (const auto& [name, info] : stored) {
    names.push_back(name);
    if (format.fp8 && hf_fp8_quantizes(name, info->shape)) {
      add_fp8_specs(name, info->shape, *format.fp8, specs, sources);
      continue;
    }
    const torch::ScalarType out = dtype ? parameter_dtype(name, *dtype) : info->dtype;
    if (out != torch::kBFloat16 && out != torch::kFloat16 && out != torch::kFloat32)
      throw Error(kCode, checkpoint + ": /model/" + name + " is " + dtype_name(info->dtype) +
                             "; safetensors exports are bf16, fp16 or fp32 (give --dtype)");
    specs.push_back({name, out, info->shape});
    sources[name] = {name, ExportSource::Part::kValues, out};
  }
  for (const auto& [copy, original] : hf_shared_copies(names, num_layers)) {
    const CheckpointReader::DatasetInfo* info = stored.at(original);
    specs.push_back({copy, dtype.value_or(info->dtype), info->shape});
    sources[copy] = {original, ExportSource::Part::kValues, dtype.value_or(info->dtype)};
  }
  return specs;
}

// Writes `json` to `tmp` in `dir`, making `dir` where it is missing; returns the directories it
// made, for a failed export to remove. Throws Error naming what could not be made or written.
std::vector<std::string> write_config_json(const std::string& dir, const std::string& tmp, const nlohmann::json& json) {
  std::vector<std::string> made_directories;
  std::string why;
  if (!files::make_directories(dir, &why, &made_directories))
    throw config_error("--output", dir, "cannot create this directory (" + why + ")");
  std::ofstream out(tmp, std::ios::trunc);
  out << json.dump(2) << "\n";
  out.close();
  if (!out) {
    std::remove(tmp.c_str());
    files::remove_empty_directories(made_directories);
    throw Error(kCode, tmp + ": cannot write");
  }
  return made_directories;
}

}  // namespace

std::string hf_config_json_path(const std::string& source) {
  const std::string dir = files::is_directory(source) ? source : files::parent(source);
  return (dir.empty() ? "." : dir) + "/config.json";
}

nlohmann::json read_hf_config_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) throw Error(kCode, path + ": not a JSON object");
  return config;
}

std::vector<std::pair<std::string, std::string>> hf_shared_copies(const std::vector<std::string>& names,
                                                                  int64_t num_hidden_layers) {
  std::set<int64_t> modules;
  for (const std::string& name : names)
    if (parameter_layer(name) >= num_hidden_layers) modules.insert(parameter_layer(name));
  std::vector<std::pair<std::string, std::string>> copies;
  for (int64_t i : modules) {
    const std::string prefix = kLayers + std::to_string(i) + ".";
    copies.emplace_back(prefix + "embed_tokens.weight", "model.embed_tokens.weight");
    copies.emplace_back(prefix + "shared_head.head.weight", "lm_head.weight");
  }
  std::sort(copies.begin(), copies.end());
  return copies;
}

std::string hf_shared_original(const std::string& name, int64_t num_hidden_layers) {
  const int64_t i = parameter_layer(name);
  if (i < num_hidden_layers) return "";
  const std::string rest = name.substr(kLayers.size() + std::to_string(i).size() + 1);
  if (rest == "embed_tokens.weight") return "model.embed_tokens.weight";
  if (rest == "shared_head.head.weight") return "lm_head.weight";
  return "";
}

HfImportResult import_hf(const std::string& source, const HfImportSettings& settings, const std::string& output) {
  const ParameterShapes shapes = parameter_shapes(settings.model);
  const HfWeights weights(source);
  const ConfigJson config = config_json_beside(source);
  check_config_json(config, settings.model);
  ImportPlan plan;
  plan_fp8(weights, config, shapes, plan);
  check_parameters(weights, source, shapes, plan);
  sort_other_tensors(weights, settings.model, shapes, plan);
  if (!plan.problems.empty()) throw import_error(plan.problems);
  HfImportResult result;
  result.dtype = settings.dtype;
  result.skipped = plan.skipped;
  result.warnings = import_warnings(weights, plan, settings.model.num_layers);
  write_imported(output, weights, plan, shapes, imported_state(settings), result);
  return result;
}

HfExportResult export_hf(const CheckpointReader& reader, const ModelConfig& model, const std::string& dir,
                         const HfExportFormat& format, uint64_t max_shard_bytes) {
  const StoredParameters stored = stored_parameters(reader, model);
  ExportSources sources;
  const std::vector<SafetensorsSpec> specs = export_specs(reader.path(), stored, format, model.num_layers, sources);
  HfExportResult result;
  for (const SafetensorsSpec& s : specs) result.bytes += static_cast<int64_t>(safetensors_bytes(s));
  result.tensors = static_cast<int64_t>(specs.size());
  result.fp8 = format.fp8.has_value();
  result.dtype = format.fp8 ? torch::kBFloat16 : format.dtype.value_or(stored.at("model.embed_tokens.weight")->dtype);
  HfConfig config = hf_config(model, result.dtype);
  if (format.fp8) config.json["quantization_config"] = hf_fp8_quantization_config(*format.fp8);
  result.warnings = config.warnings;
  // A bf16/fp16 run's fp32 master is the weight itself; its parameter is that rounded.
  auto weight = [&](const std::string& parameter) { return reader.read(weight_dataset(reader, parameter)); };
  HfFp8Quantizer quantizer(format.fp8.value_or(Fp8BlockSize{}), weight);
  auto tensor = [&](const std::string& name) {
    const ExportSource& source = sources.at(name);
    switch (source.part) {
      case ExportSource::Part::kCodes: return quantizer.quantized(source.parameter).codes;
      case ExportSource::Part::kScales: return quantizer.quantized(source.parameter).scale_inv;
      case ExportSource::Part::kValues: break;
    }
    return weight(source.parameter).to(source.dtype);
  };

  // config.json is written first, and the one of an earlier export leaves before the weights are
  // replaced: a directory whose export failed midway has no config.json, never old and new mixed.
  // A failed export into a directory it made leaves no directory behind.
  const std::string path = dir + "/config.json", tmp = path + ".tmp";
  const std::vector<std::string> made_directories = write_config_json(dir, tmp, config.json);
  std::remove(path.c_str());
  try {
    result.files = write_hf_weights(dir, specs, tensor, max_shard_bytes);
  } catch (...) {
    std::remove(tmp.c_str());
    files::remove_empty_directories(made_directories);
    throw;
  }
  std::string why;
  if (!files::rename(tmp, path, &why)) throw Error(kCode, "cannot rename " + tmp + " to " + path + ": " + why);
  result.files.push_back("config.json");
  return result;
}

}  // namespace dstrain
