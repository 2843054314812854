// `dstrain train`: data-parallel training of a DeepSeek-LLM model on this rank's share of each
// global batch, collective over MPI_COMM_WORLD, on the CPU or one GPU per rank.
#pragma once

#include <cstdint>
#include <string>

#include "dstrain/core/config.h"

namespace dstrain {

struct TrainResult {
  int64_t steps = 0;
  int64_t start_step = 0;         // the step this process went on from: a resumed checkpoint's, or 0
  int64_t consumed_samples = 0;   // by the steps, the resumed ones included
  double final_loss = 0.0;
  double final_eval_loss = -1.0;  // -1 without a validation corpus
  std::string param_digest;       // FNV-1a over every parameter's name and bytes
  // Throughput after warm-up: over the log intervals after the first (the first pays for
  // allocation and kernel selection), or over the only one.
  double tokens_per_s = 0.0;
  double mfu = 0.0;               // 0 when the device's peak is unknown
  int64_t peak_memory_bytes = 0;  // GPU: the caching allocator's peak; CPU: peak resident memory
  // The most a training step held in tensors above what it started with (or kept past its end):
  // its activations and temporaries (core/step_memory.h); 0 when no step ran.
  int64_t peak_activation_bytes = 0;
  // The most a step kept past its end: the FP8 weight copies (model/fp8_weight_cache.h) made in
  // the first step, and what LibTorch allocates once. The largest rank's.
  int64_t step_kept_bytes = 0;
  // Host seconds this rank spent rerunning recomputed parts in backward passes (model/recompute.h).
  double rerun_seconds = 0;
  // Context parallelism: the bytes this rank passed around the cp ring, over the steps this process
  // ran (evaluations' passes included); 0 without it.
  int64_t ring_bytes = 0;
  bool requeue = false;           // stopped by a signal after a checkpoint: exit with kRequeue
  // Where the run directory's files are (run_files_text), for `train` to say: on world rank 0,
  // once the summary is written. (A benchmark deletes its run directory and says nothing of it.)
  std::string run_files;
};

// Reads and checks the configuration, resumes from a checkpoint when ckpt.resume finds one,
// trains, checkpoints, and writes the run directory (config.ini, metrics.jsonl, summary.json).
// On SIGTERM or SIGUSR1 it checkpoints and returns with `requeue` set. Throws Error with an exit code; an error that one rank hits
// during training is reported by that rank, which then ends the whole job (MPI_Abort).
TrainResult run_training(Options options);

}  // namespace dstrain
