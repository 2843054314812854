#include "ckpt_hf.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "command_args.h"
#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/format.h"
#include "dstrain/ckpt/hf_config.h"
#include "dstrain/ckpt/hf_conversion.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/heap.h"
#include "dstrain/core/log.h"
#include "dstrain/model/model_config.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

const char* kImportHfUsage =
    "usage: dstrain ckpt import-hf PATH [--config FILE.ini] --output CKPT.h5 [--section.key value ...]\n"
    "\n"
    "Reads Hugging Face safetensors weights (PATH: a .safetensors file, or a directory with\n"
    "model.safetensors or with shards and model.safetensors.index.json; BF16, F16, F32, or DeepSeek's\n"
    "block-scaled F8_E4M3 with their weight_scale_inv and config.json's quantization_config) into a new\n"
    "checkpoint CKPT.h5 for the model that FILE.ini configures (its [model] keys, train.precision for\n"
    "the stored dtype), or without --config the model that the config.json beside the weights\n"
    "describes. Every parameter must be in the files with the same shape. `dstrain eval` and\n"
    "`generate` read the checkpoint; `dstrain train --ckpt.load_weights CKPT.h5` fine-tunes from it.\n";

const char* kExportHfUsage =
    "usage: dstrain ckpt export-hf CKPT --output DIR [--dtype bf16|fp16|fp32|fp8] [--max-shard-size SIZE]\n"
    "\n"
    "Writes the model of checkpoint CKPT (a file, or a checkpoint directory: its latest) into DIR as\n"
    "Hugging Face weights: model.safetensors, or shards model-0000i-of-0000N.safetensors of at most\n"
    "SIZE (default 5GB; B, KB, MB, GB, KiB, MiB, GiB) and model.safetensors.index.json, and config.json.\n"
    "  --dtype D            the tensors' dtype (default: as stored in the checkpoint); fp8: DeepSeek-V3's\n"
    "                       layout, the attention and MLP projections F8_E4M3 with a weight_scale_inv\n"
    "                       per 128x128 block, the rest bf16\n";

namespace {

// "5GB", "500MB", "2GiB", "1000": bytes.
uint64_t parse_size(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double number = std::strtod(text.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  else if (unit == "KiB") scale = 1024.0;
  else if (unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "GiB") scale = 1024.0 * 1024 * 1024;
  const double bytes = number * scale;
  if (text.empty() || end == text.c_str() || errno != 0 || scale == 0 || !std::isfinite(bytes) || bytes < 1 ||
      bytes > 1e18)
    throw config_error("--max-shard-size", text, "expected a size such as 5GB, 500MB, 2GiB or a number of bytes");
  return static_cast<uint64_t>(bytes);
}

// An import without a dstrain configuration: the `--model.*` arguments that turn the default model
// into the one the config.json beside `source` describes (every setting config.json and dstrain
// share that changes the logits, the multi-token prediction depth, max_position_embeddings, the
// balance loss's weight),
// followed by `overrides`, which win. Throws Error(kUsage) when there is no config.json.
std::vector<std::string> model_arguments_from_config_json(const std::string& source,
                                                          const std::vector<std::string>& overrides) {
  const std::string path = hf_config_json_path(source);
  if (!files::is_regular_file(path))
    throw Error(ExitCode::kUsage, "ckpt import-hf: no config.json beside " + source +
                                      " to take the model from; give --config FILE.ini");
  const nlohmann::json config = read_hf_config_json(path);
  std::vector<std::string> derived;
  // What the comparison leaves aside (it changes no logits) but an import should keep.
  for (const auto& [key, option] : {std::pair<const char*, const char*>{"num_nextn_predict_layers",
                                                                        "--model.num_nextn_predict_layers"},
                                    {"max_position_embeddings", "--model.max_seq_len"}})
    if (config.contains(key) && config[key].is_number_integer())
      derived.insert(derived.end(), {option, std::to_string(config[key].get<int64_t>())});
  // The balance loss's weight, a training setting: a model fine-tuned from the import, or exported
  // again, keeps the one it came with.
  if (config.contains("aux_loss_alpha") && config["aux_loss_alpha"].is_number())
    derived.insert(derived.end(), {"--model.aux_loss_alpha", config["aux_loss_alpha"].dump()});
  // The comparison names the option of each setting that differs: applied, they leave none (a
  // second round settles settings whose comparison depends on others, such as MLA's head sizes).
  const OptionTable table = train_option_table();
  // The default training sequence, where it fits in the model's positions (an import records one).
  const int64_t seq_len = parse_command_line(table, {}).options.get_int("train.seq_len", 1);
  if (config.contains("max_position_embeddings") && config["max_position_embeddings"].is_number_integer() &&
      config["max_position_embeddings"].get<int64_t>() < seq_len)
    derived.insert(derived.end(), {"--train.seq_len", std::to_string(config["max_position_embeddings"].get<int64_t>())});
  for (int round = 0; round < 3; ++round) {
    std::vector<std::string> args = derived;
    args.insert(args.end(), overrides.begin(), overrides.end());
    const HfConfigDifferences differences =
        hf_config_differences(read_model_config(parse_command_line(table, args).options), config);
    if (differences.overrides.empty()) break;
    for (const std::string& option : differences.overrides) {  // "--model.key value"
      const size_t space = option.find(' ');
      derived.insert(derived.end(), {option.substr(0, space), option.substr(space + 1)});
    }
  }
  derived.insert(derived.end(), overrides.begin(), overrides.end());
  return derived;
}

// What the import takes of the configuration's options.
HfImportSettings import_settings(const Options& options) {
  HfImportSettings settings;
  settings.model = read_model_config(options);
  settings.dtype = options.get_enum("train.precision", precision_names());
  settings.seed = static_cast<uint64_t>(options.get_int("run.seed", 0));
  settings.seq_len = static_cast<uint64_t>(options.get_int("train.seq_len", 1, settings.model.max_seq_len));
  settings.global_batch = static_cast<uint64_t>(options.get_int("train.global_batch", 0));
  settings.config = options.to_ini();
  settings.schedule = options.raw("parallel.schedule");
  return settings;
}

// The model that the checkpoint's configuration describes, read as `dstrain train` reads it.
ModelConfig checkpoint_model_config(const CheckpointReader& reader) {
  const OptionTable table = train_option_table();
  try {
    return read_model_config(parse_command_line(table, checkpoint_config_arguments(reader.state().config)).options);
  } catch (const Error& e) {
    throw Error(ExitCode::kCheckpoint, reader.path() + ": its configuration does not read: " + e.what());
  }
}

// Both conversions hold one tensor at a time; tensors from this size up are given back to the
// system as soon as they are freed, so that the peak memory is that of the largest (heap.h).
constexpr size_t kMappedTensorBytes = 1 << 20;

std::string megabytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return text;
}

}  // namespace

int import_hf_command(const std::vector<std::string>& args) {
  const CommandArgs parsed = split_command_args(args, {"config", "output"}, "ckpt import-hf");
  if (parsed.help) {
    std::cout << kImportHfUsage;
    return 0;
  }
  // The first argument that is no option is the source; the rest are --section.key overrides.
  if (parsed.overrides.empty() || parsed.overrides[0].rfind("--", 0) == 0)
    throw Error(ExitCode::kUsage, std::string("ckpt import-hf: give the safetensors file or directory first\n") +
                                      kImportHfUsage);
  const std::string source = parsed.overrides[0];
  const std::vector<std::string> overrides(parsed.overrides.begin() + 1, parsed.overrides.end());
  if (!parsed.own.count("output"))
    throw Error(ExitCode::kUsage, std::string("ckpt import-hf: give --output\n") + kImportHfUsage);
  const std::string output = parsed.own.at("output");
  if (files::is_directory(output))
    throw config_error("--output", output, "a directory; give the checkpoint file to write, such as " + output +
                                               "/imported.h5");
  const OptionTable table = train_option_table();
  std::vector<std::string> config_args;
  if (parsed.own.count("config")) {
    config_args = {"--config", parsed.own.at("config")};
    config_args.insert(config_args.end(), overrides.begin(), overrides.end());
  } else {
    config_args = model_arguments_from_config_json(source, overrides);
    std::string taken;
    for (const std::string& arg : config_args) taken += " " + arg;
    log::info("the model of ", source, "'s config.json:", taken);
  }
  const ParsedCommandLine config = parse_command_line(table, config_args);

  heap::map_allocations_from(kMappedTensorBytes);
  const HfImportResult result = import_hf(source, import_settings(config.options), output);
  for (const std::string& warning : result.warnings) log::warning(warning);
  std::printf("imported %lld tensors (%s, %s) from %s into %s", static_cast<long long>(result.tensors),
              megabytes(result.bytes).c_str(), dtype_name(result.dtype), source.c_str(), output.c_str());
  if (!result.skipped.empty()) {
    std::printf("; skipped %zu:", result.skipped.size());
    for (size_t i = 0; i < result.skipped.size() && i < 6; ++i) std::printf(" %s", result.skipped[i].c_str());
    if (result.skipped.size() > 6) std::printf(" ...");
  }
  std::printf("\n");
  return 0;
}

int export_hf_command(const std::vector<std::string>& args) {
  const CommandArgs parsed = split_command_args(args, {"output", "dtype", "max-shard-size"}, "ckpt export-hf");
  if (parsed.help) {
    std::cout << kExportHfUsage;
    return 0;
  }
  if (parsed.overrides.size() != 1 || parsed.overrides[0].rfind("--", 0) == 0)
    throw Error(ExitCode::kUsage, std::string("ckpt export-hf: expected one checkpoint and the options below") +
                                      (parsed.overrides.size() > 1 ? " (unknown: " + parsed.overrides[1] + ")" : "") +
                                      "\n" + kExportHfUsage);
  if (!parsed.own.count("output"))
    throw Error(ExitCode::kUsage, std::string("ckpt export-hf: give --output DIR\n") + kExportHfUsage);
  HfExportFormat format;
  if (parsed.own.count("dtype")) {
    const std::string& name = parsed.own.at("dtype");
    if (name == "bf16") format.dtype = torch::kBFloat16;
    else if (name == "fp16") format.dtype = torch::kFloat16;
    else if (name == "fp32") format.dtype = torch::kFloat32;
    else if (name == "fp8") format.fp8 = Fp8BlockSize{};  // DeepSeek's 128 × 128
    else throw config_error("--dtype", name, "expected bf16, fp16, fp32 or fp8");
  }
  const uint64_t max_shard = parse_size(parsed.own.count("max-shard-size") ? parsed.own.at("max-shard-size") : "5GB");
  if (!files::exists(parsed.overrides[0]))
    throw Error(ExitCode::kCheckpoint, parsed.overrides[0] + ": no such checkpoint file or directory");
  const std::string checkpoint = resolve_checkpoint(parsed.overrides[0], "CKPT");
  const std::string dir = parsed.own.at("output");

  const CheckpointReader reader(checkpoint);
  heap::map_allocations_from(kMappedTensorBytes);
  const HfExportResult result = export_hf(reader, checkpoint_model_config(reader), dir, format, max_shard);
  for (const std::string& warning : result.warnings) log::warning(warning);
  const std::string dtypes = result.fp8 ? "fp8 e4m3 in 128x128 blocks, the rest bf16" : dtype_name(result.dtype);
  std::printf("exported %lld tensors (%s, %s) of %s into %s:", static_cast<long long>(result.tensors),
              megabytes(result.bytes).c_str(), dtypes.c_str(), checkpoint.c_str(), dir.c_str());
  for (const std::string& file : result.files) std::printf(" %s", file.c_str());
  std::printf("\n");
  return 0;
}

}  // namespace dstrain
