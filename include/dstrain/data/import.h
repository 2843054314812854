// Imports of token corpora made by other trainers into a dstrain corpus, document boundaries
// kept, streamed in bounded memory.
//
// llm.c (karpathy/llm.c) token shards, `.bin`: a header of 256 little-endian int32 (magic
// 20240520, version 1 = uint16 tokens or 2 = uint32 tokens, the number of tokens), then the
// tokens. Documents are delimited by the end-of-text token placed before each one (GPT-2's
// 50256 by default); shards may cut a document, so the shards given are read as one stream, in
// order. Each document becomes a dstrain document ending with that token.
//
// Megatron-LM indexed datasets (`PREFIX.idx` + `PREFIX.bin`, "MMIDIDX" version 1): the index holds
// the token dtype, the length and byte offset of each sequence and the sequence where each
// document starts. Each document becomes a dstrain document; `eod_id` is appended unless the
// document already ends with it (Megatron's --append-eod).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/data/corpus.h"

namespace dstrain {

// What `dstrain data import --format` reads: llm.c's .bin token shards, or Megatron-LM's
// PREFIX.idx + PREFIX.bin datasets.
enum class ImportFormat { kLlmc, kMegatron };
// --format's text as the format; throws Error(kUsage) naming --format for any other.
ImportFormat import_format_named(const std::string& name);

struct ImportOptions {
  ImportFormat format = ImportFormat::kLlmc;
  std::vector<std::string> inputs;  // llm.c: shard files; megatron: prefixes (or their .bin/.idx)
  std::string output;
  int64_t eod_id = -1;              // -1: llm.c's GPT-2 default (50256); required for megatron
  int64_t vocab_size = -1;          // -1: llm.c version 1's GPT-2 default (50257); required otherwise
  std::string tokenizer_name;       // recorded in the corpus; default: the format's name
};

// Throws Error(kUsage) for bad options, Error(kData) naming the file and the field (header entry,
// sequence, document) for anything that is not a valid corpus of that format.
CorpusInfo import_corpus(const ImportOptions& options);

// What a file is, and its main figures, as lines of text: a dstrain corpus (HDF5), an llm.c
// shard, or a Megatron dataset (.idx, .bin or the prefix). Throws Error(kData) otherwise.
std::string inspect_corpus(const std::string& path, uint64_t show_tokens);

// `dstrain data verify`: reads every token of a dstrain corpus and its document offsets, and
// throws Error(kData) naming the first token at or above the vocabulary size (with its position
// and document), what training would trip on hours later. Returns the line saying all is well.
std::string verify_corpus(const std::string& path);

}  // namespace dstrain
