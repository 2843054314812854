// `dstrain train`: data-parallel training of a DeepSeek-LLM model on this rank's share of each
// global batch, collective over MPI_COMM_WORLD.
#pragma once

#include <string>

#include "dstrain/core/config.h"

namespace dstrain {

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0.0;
  double final_eval_loss = -1.0;  // -1 without a validation corpus
  std::string param_digest;       // FNV-1a over every parameter's name and bytes
};

// Reads and checks the configuration, trains, and writes the run directory (config.ini,
// metrics.jsonl, summary.json). Throws Error with an exit code; an error that one rank hits
// during training is reported by that rank, which then ends the whole job (MPI_Abort).
TrainResult run_training(Options options);

}  // namespace dstrain
