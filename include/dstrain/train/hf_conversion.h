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

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/core/config.h"

namespace dstrain {

// The i of a "model.layers.{i}.*" name, or -1.
int64_t hf_layer_index(const std::string& name);

// For every layer index i >= num_hidden_layers that `names` use, the copies a Hugging Face file
// holds of what its module shares: {copy name, the main model's name}, sorted by copy name.
std::vector<std::pair<std::string, std::string>> hf_shared_copies(const std::vector<std::string>& names,
                                                                  int64_t num_hidden_layers);
// The main model's name of which `name` is such a copy, or "".
std::string hf_shared_original(const std::string& name, int64_t num_hidden_layers);

struct HfImportResult {
  int64_t tensors = 0, bytes = 0;        // written into the checkpoint
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<std::string> skipped;      // tensors of the files left out (shared copies, unbuilt MTP modules)
  std::vector<std::string> warnings;
};

// Builds the model of `options` (a dstrain configuration: --config FILE with overrides) and fills
// every parameter from the safetensors at `source` (a file, or a directory with one file or
// shards and their index), converted to train.precision, into the checkpoint `output` (written
// whole or not at all). Throws Error(kCheckpoint) naming the file and the tensor when a parameter
// is missing, has another shape or an unreadable dtype, or a tensor of the files belongs to no
// parameter (another model); Error(kUsage) for a bad configuration.
HfImportResult import_hf(const std::string& source, Options options, const std::string& output);

// An import without a dstrain configuration: the `--model.*` arguments that turn the default model
// into the one the config.json beside `source` describes (every setting config.json and dstrain
// share that changes the logits, the multi-token prediction depth, max_position_embeddings),
// followed by `overrides`, which win. Throws Error(kUsage) when there is no config.json.
std::vector<std::string> model_arguments_from_config_json(const std::string& source,
                                                          const std::vector<std::string>& overrides);

struct HfExportResult {
  std::vector<std::string> files;  // written into the directory, config.json last
  int64_t tensors = 0, bytes = 0;
  torch::ScalarType dtype = torch::kFloat32;  // config.json's torch_dtype
  std::vector<std::string> warnings;
};

// Writes the model of `checkpoint` (a file) into `dir`: safetensors (shards of at most
// `max_shard_bytes`), converted to `dtype` or in the stored dtype, and config.json from the
// checkpoint's configuration. Throws Error(kCheckpoint) naming the file and dataset.
HfExportResult export_hf(const std::string& checkpoint, const std::string& dir, std::optional<torch::ScalarType> dtype,
                         uint64_t max_shard_bytes);

}  // namespace dstrain
