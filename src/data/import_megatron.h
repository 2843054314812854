// Megatron-LM indexed datasets (see include/dstrain/data/import.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/data/import.h"

namespace dstrain::megatron {

struct Index {
  std::string prefix;
  uint8_t dtype_code = 0;
  size_t token_bytes = 0;
  bool is_signed = false;
  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> sequence_pointers;  // byte offsets into PREFIX.bin
  std::vector<int64_t> document_starts;    // sequence indices; first 0, last the number of sequences
};

// "data/x", "data/x.bin" or "data/x.idx" → "data/x".
std::string prefix_of(const std::string& path);
bool looks_like_index(const std::string& path);
// Reads PREFIX.idx and checks it, and PREFIX.bin's size, against each other.
Index read_index(const std::string& prefix);
CorpusInfo import_datasets(const ImportOptions& options);

}  // namespace dstrain::megatron
