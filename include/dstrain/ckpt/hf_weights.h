// A Hugging Face model's weights as safetensors files: one model.safetensors, or shards
// model-00001-of-0000N.safetensors that model.safetensors.index.json maps the tensor names to
// ({"metadata": {"total_size": BYTES}, "weight_map": {"NAME": "FILE", ...}}), as transformers'
// save_pretrained writes them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/ckpt/safetensors.h"

namespace dstrain {

constexpr const char* kHfSingleFile = "model.safetensors";
constexpr const char* kHfIndexFile = "model.safetensors.index.json";

class HfWeights {
 public:
  // `path`: a .safetensors file, or a directory with model.safetensors.index.json (then its
  // shards) or model.safetensors. Every file's header is read and checked; throws
  // Error(kCheckpoint) naming the file (and tensor) when one is missing or damaged, when the
  // index maps a tensor to a file that does not hold it, or when two files hold the same name.
  explicit HfWeights(const std::string& path);

  std::vector<std::string> names() const;  // sorted
  // nullptr when no file holds `name`.
  const SafetensorsEntry* find(const std::string& name) const;
  // The file that holds `name`.
  const std::string& file_of(const std::string& name) const;
  // Throws Error(kCheckpoint) naming the file and tensor (missing, or not BF16/F16/F32).
  torch::Tensor read(const std::string& name) const;
  // The uint8 codes of an F8_E4M3 tensor (SafetensorsReader::read_e4m3).
  torch::Tensor read_e4m3(const std::string& name) const;
  const std::vector<std::string>& files() const { return paths_; }

 private:
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
  std::vector<std::string> paths_;
  std::vector<std::pair<std::string, size_t>> index_;  // name → reader, sorted by name
  const SafetensorsReader* reader_of(const std::string& name) const;
};

// Writes the tensors of `specs` into `dir` (created if missing): model.safetensors when they
// fit in `max_shard_bytes`, else shards of at most that size (a larger tensor alone in its own)
// filled in name order, and the index. Metadata {"format": "pt"}, as PyTorch's writers put it.
// Every file is written under a temporary name first and renamed only when all are complete; then
// the files of an earlier export in `dir` that this one did not write (model.safetensors,
// model-*-of-*.safetensors, the index) are removed. Returns the file names written, in order.
std::vector<std::string> write_hf_weights(const std::string& dir, const std::vector<SafetensorsSpec>& specs,
                                          const TensorSource& source, uint64_t max_shard_bytes);

}  // namespace dstrain
