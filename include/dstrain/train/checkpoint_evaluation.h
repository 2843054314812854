// `dstrain eval`: the loss and perplexity of a checkpoint on a corpus, on any DP × PP layout
// (checkpoints are layout-free), computed by the same function as the training loop's eval_loss.
#pragma once

#include <cstdint>
#include <string>

#include "dstrain/core/config.h"

namespace dstrain {

struct CheckpointEvaluation {
  std::string checkpoint, corpus;
  int64_t step = 0;          // the checkpoint's training step
  double loss = 0, perplexity = 0;
  int64_t batches = 0, sequences = 0, tokens = 0;  // predicted tokens
  double seconds = 0;
};

// `options`: train_option_table() values, the checkpoint's configuration with the command line's
// overrides applied (checkpoint_config_arguments). `batches` global batches from the start of
// the corpus; 0: every one it holds. Collective over MPI_COMM_WORLD (MPI is initialised).
// Throws Error with the exit code of what is wrong (docs/troubleshooting.md, "Exit codes").
CheckpointEvaluation evaluate_checkpoint(Options options, const std::string& checkpoint, const std::string& corpus,
                                         int64_t batches);

}  // namespace dstrain
