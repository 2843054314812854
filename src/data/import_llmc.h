// llm.c token shards (see include/dstrain/data/import.h).
#pragma once

#include <cstdint>
#include <string>

#include "dstrain/data/import.h"

namespace dstrain::llmc {

constexpr int32_t kMagic = 20240520;
constexpr size_t kHeaderInts = 256;

struct ShardHeader {
  int32_t version = 0;
  uint64_t n_tokens = 0;
  size_t token_bytes = 0;  // 2 or 4
};

// Reads and checks the header against the file's size; Error(kData) naming the file and entry.
ShardHeader read_header(const std::string& path);
bool looks_like_shard(const std::string& path);
CorpusInfo import_shards(const ImportOptions& options);

}  // namespace dstrain::llmc
