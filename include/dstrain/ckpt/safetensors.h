// One safetensors file (github.com/huggingface/safetensors), the format of Hugging Face weights:
//   8 bytes   N, the length of the header, a little-endian unsigned 64-bit integer
//   N bytes   a JSON object {"NAME": {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [BEGIN, END]},
//             ..., "__metadata__": {"key": "value", ...}} (the metadata optional), padded with spaces
//   the rest  the byte buffer: tensor NAME is its bytes [BEGIN, END), row-major, little-endian
// The reader checks the header against the file before anything is read; the writer lays tensors
// out in name order with a fixed header form, so that the same tensors give the same bytes.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dstrain/ckpt/parameter_file.h"

namespace dstrain {

// The format's name of E4M3 codes (core/fp8_e4m3.h).
constexpr const char* kSafetensorsE4M3 = "F8_E4M3";

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as the file names it: "BF16", "F16", "F32", "F8_E4M3", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // within the byte buffer
};

// BF16, F16 and F32: the dtypes dstrain reads into tensors and writes. Throws Error(kUsage) for
// any other torch dtype.
const char* safetensors_dtype_name(torch::ScalarType dtype);

class SafetensorsReader {
 public:
  // Reads and checks the header. Throws Error(kCheckpoint) naming the file (and the tensor) when
  // the file is missing or shorter than its header says, the header is not a JSON object of the
  // form above, a dtype is unknown, or a tensor's data offsets lie outside the byte buffer,
  // overlap another's, or do not span shape × dtype size bytes.
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // sorted by name
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A CPU tensor of the file's dtype. Throws Error(kCheckpoint) naming the file and the tensor
  // when it is missing, or of a dtype other than BF16, F16 and F32 (naming the dtype).
  torch::Tensor read(const std::string& name) const;
  // The codes of an F8_E4M3 tensor as a uint8 tensor of its shape (core/fp8_e4m3.h decodes them).
  // Throws Error(kCheckpoint) naming the file and the tensor when it is missing or of another dtype.
  torch::Tensor read_e4m3(const std::string& name) const;

 private:
  const SafetensorsEntry& entry(const std::string& name) const;  // throws when missing
  torch::Tensor read_bytes(const SafetensorsEntry& e, torch::ScalarType dtype) const;

  std::string path_;
  uint64_t data_start_ = 0;  // 8 + N
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// What a tensor to be written will be, before its data are at hand.
struct SafetensorsSpec {
  std::string name;
  torch::ScalarType dtype;  // BF16, F16 or F32; uint8 for E4M3 codes
  std::vector<int64_t> shape;
  // The uint8 tensor holds E4M3 codes, written as F8_E4M3: LibTorch 1.13 has no dtype to say so.
  bool e4m3 = false;
};
// The data of the tensor `name`, of the dtype and shape its spec says (checked).
using TensorSource = std::function<torch::Tensor(const std::string& name)>;

// Writes PATH.tmp and renames it PATH (the caller may keep it as PATH.tmp: `rename` false),
// asking `source` for one tensor at a time, in name order. The header lists "__metadata__"
// first, then the tensors by name, each as {"dtype", "shape", "data_offsets"}, padded with
// spaces to a multiple of 8 bytes; the data follow in the same order, without gaps. Throws
// Error(kCheckpoint) naming the file when it cannot be written.
void write_safetensors(const std::string& path, std::vector<SafetensorsSpec> specs, const TensorSource& source,
                       const std::map<std::string, std::string>& metadata, bool rename = true);
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata);

// Bytes of the data of a tensor of this spec.
uint64_t safetensors_bytes(const SafetensorsSpec& spec);

}  // namespace dstrain
