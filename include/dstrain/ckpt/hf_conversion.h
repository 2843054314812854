// Hugging Face weights into and out of dstrain checkpoints (`dstrain ckpt import-hf`,
// `dstrain ckpt export-hf`). Parameter names need no mapping: dstrain's are Hugging Face's. An
// imported checkpoint is the file a run writes at step 0 with the model alone (no optimizer
// state): `dstrain eval` and `generate` read it, and a training run starts from its weights with
// ckpt.load_weights.
//
// Multi-token prediction modules are the layers numbered from num_hidden_layers on
// ("model.layers.{L+k}.*"); they share the main model's embedding and head, of which DeepSeek-V3's
// files keep copies, "model.layers.{L+k}.embed_tokens.weight" and
// "model.layers.{L+k}.shared_head.head.weight": an export writes them, an import checks and skips them.
#pragma once

#include "dstrain/core/torch_api.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/fp8_blocks.h"
#include "dstrain/model/model_config.h"

namespace dstrain {

// For every layer index i >= num_hidden_layers that `names` use, the copies a Hugging Face file
// holds of what its module shares: {copy name, the main model's name}, sorted by copy name.
std::vector<std::pair<std::string, std::string>> hf_shared_copies(const std::vector<std::string>& names,
                                                                  int64_t num_hidden_layers);
// The main model's name of which `name` is such a copy, or "".
std::string hf_shared_original(const std::string& name, int64_t num_hidden_layers);

// The config.json beside Hugging Face weights (in their directory, or beside their one file),
// where a Hugging Face model describes itself; it need not exist.
std::string hf_config_json_path(const std::string& source);
// Its contents. Throws Error(kCheckpoint) naming the file when it is not a JSON object.
nlohmann::json read_hf_config_json(const std::string& path);

// What an import takes of a dstrain configuration; the caller reads it from the options.
struct HfImportSettings {
  ModelConfig model;                          // whose every parameter the files must fill
  torch::ScalarType dtype = torch::kFloat32;  // train.precision: the parameters' dtype in the checkpoint
  uint64_t seed = 0;                          // run.seed: the generator state the checkpoint records
  // Recorded in the checkpoint's /trainer as a run's own checkpoint records them.
  uint64_t seq_len = 0, global_batch = 0;
  std::string config;    // the effective configuration (INI)
  std::string schedule;  // parallel.schedule
};

struct HfImportResult {
  int64_t tensors = 0, bytes = 0;        // written into the checkpoint
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<std::string> skipped;      // tensors of the files left out (shared copies, unbuilt MTP modules)
  std::vector<std::string> warnings;
};

// Fills every parameter of `settings.model` from the safetensors at `source` (a file, or a
// directory with one file or shards and their index), converted to `settings.dtype`, into the
// checkpoint `output` (written whole or not at all), one tensor at a time. F8_E4M3 parameters
// are multiplied by their block scales (hf_fp8.h) in the block size of config.json's
// quantization_config; the scale tensors are consumed with them. Throws Error(kCheckpoint) naming
// the file and the tensor when a parameter is missing, has another shape or an unreadable dtype,
// an FP8 one has no scales, scales of another shape or scales that are not finite and positive,
// or no quantization_config, or a tensor of the files belongs to no parameter (another model);
// Error(kUsage) when the config.json beside `source` describes another model, or `output`'s
// directory cannot be made.
HfImportResult import_hf(const std::string& source, const HfImportSettings& settings, const std::string& output);

// The tensors' dtypes of an export: `dtype` (as stored when unset); or, with `fp8`, DeepSeek's
// FP8 layout (hf_fp8.h) in blocks of `fp8`, every other tensor BF16 (the MoE balancing bias F32).
struct HfExportFormat {
  std::optional<torch::ScalarType> dtype;
  std::optional<Fp8BlockSize> fp8;
};

struct HfExportResult {
  std::vector<std::string> files;  // written into the directory, config.json last
  int64_t tensors = 0, bytes = 0;  // scales of FP8 weights included
  torch::ScalarType dtype = torch::kFloat32;  // config.json's torch_dtype
  bool fp8 = false;                           // with FP8 weights and config.json's quantization_config
  std::vector<std::string> warnings;
};

// Writes the model of `checkpoint`, `model` being the one its configuration describes, into
// `dir`: safetensors (shards of at most `max_shard_bytes`) in `format`, and config.json. Throws
// Error(kCheckpoint) naming the file and dataset (and a weight that FP8 cannot hold: NaN, inf).
HfExportResult export_hf(const CheckpointReader& checkpoint, const ModelConfig& model, const std::string& dir,
                         const HfExportFormat& format, uint64_t max_shard_bytes);

}  // namespace dstrain
