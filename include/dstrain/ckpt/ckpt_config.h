// The [ckpt] section: when checkpoints are written, where, how many are kept, and what a run
// starts from.
#pragma once

#include <string>

#include "dstrain/core/config.h"

namespace dstrain {

// ckpt.resume: auto (the checkpoint directory's latest, if any), none (afresh), or a checkpoint.
struct ResumeFrom {
  enum Kind { kAuto, kNone, kPath } kind = kAuto;
  std::string path;  // kPath: a checkpoint file, or a directory of them
};

struct CkptConfig {
  std::string dir;           // resolved: never empty (RUN_DIR/checkpoints by default)
  bool dir_in_run_dir = true;  // ckpt.dir unset: `dir` is RUN_DIR/checkpoints (errors name run.dir)
  int64_t interval = 0;      // steps between checkpoints (0: only on a signal)
  int keep_last = 3;         // retention: the newest K (0: all) ...
  int keep_every = 0;        // ... and every one whose step is a multiple of N (0: none)
  ResumeFrom resume;
  std::string load_weights;     // a checkpoint whose model starts a new run ("": none)
  bool save_final = false;   // RUN_DIR/final_model.h5 at the end
};

void add_ckpt_options(OptionTable& table);
// `run_dir` is where checkpoints go unless ckpt.dir says otherwise.
CkptConfig read_ckpt_config(const Options& options, const std::string& run_dir);

}  // namespace dstrain
