// `dstrain prep`: text files (one document each) and JSONL files (one document per line, in its
// "text" field) → a tokenized corpus, optionally with a validation split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/data/corpus.h"

namespace dstrain {

struct PrepOptions {
  std::vector<std::string> inputs;
  std::string output;
  std::string valid_output;  // default: OUTPUT with ".valid" before its extension
  double valid_fraction = 0.0;
  std::string tokenizer = "byte";
};

struct PrepSummary {
  CorpusInfo train;
  CorpusInfo valid;  // n_documents == 0 when no split was asked for
  uint64_t input_bytes = 0;
  double seconds = 0.0;
};

// "corpus.h5" → "corpus.valid.h5"
std::string default_valid_path(const std::string& output);

// Throws Error(kUsage) for bad options and Error(kData) naming the file (and line) for missing or
// invalid input and for an empty result. Progress goes through log::info.
PrepSummary run_prep(const PrepOptions& options);

}  // namespace dstrain
