// `dstrain prep`: text files (one document each) and JSONL files (one document per line, in its
// "text" field) → a tokenized corpus, optionally with a validation split and shuffled documents.
//
// Parallel at two levels: MPI ranks take contiguous blocks of the input files (balanced by size)
// and each writes a part corpus next to the output; within a rank, a reader thread streams
// documents in batches, worker threads tokenize them, and the batches are written in order. The
// lowest rank then joins the parts into the output corpus (and the validation corpus), in input
// order or shuffled. The result is the same for any number of ranks and threads.
//
// Memory stays bounded whatever the size of the inputs: at most about `memory_limit_mb` of text
// and tokens are in flight, and a document larger than that is read in segments (see
// document_reader.h); what grows with the input is only the list of document boundaries.
#pragma once

#include <cstdint>
#include <functional>
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
  std::string eod_token;           // tokenizer.json only; empty: a usual name
  unsigned threads = 0;            // tokenizing threads per rank; 0: every core
  bool shuffle = false;            // shuffle the documents of each split (by `seed`)
  uint64_t seed = 0;
  uint64_t memory_limit_mb = 1024;  // text and tokens in flight per rank
  // Several processes: this one's rank, their number, and an in-place sum over all of them
  // (an MPI all-reduce). Left empty: one process.
  int rank = 0;
  int world = 1;
  std::function<void(uint64_t* values, int count)> sum_over_ranks;
};

struct PrepSummary {
  CorpusInfo train;
  CorpusInfo valid;  // n_documents == 0 when no split was asked for
  uint64_t input_bytes = 0;   // over all ranks
  double seconds = 0.0;       // all of it
  double tokenize_seconds = 0.0;  // reading and tokenizing (the rest: joining the parts)
  // CPU time of reading and tokenizing, all threads of all ranks: MB per CPU-second is the
  // throughput per core, whatever else runs on the machine.
  double tokenize_cpu_seconds = 0.0;
  unsigned threads = 1;       // per rank
  int ranks = 1;
};

// "corpus.h5" → "corpus.valid.h5"
std::string default_valid_path(const std::string& output);

// Throws Error(kUsage) for bad options and Error(kData) naming the file (and line) for missing or
// invalid input and for an empty result. Progress goes through log::info. With several ranks an
// error is reported by the rank that found it; the others throw Error(code, "") (nothing to add).
PrepSummary run_prep(const PrepOptions& options);

}  // namespace dstrain
