#include "dstrain/ckpt/ckpt_config.h"

#include "dstrain/core/error.h"

namespace dstrain {

void add_ckpt_options(OptionTable& t) {
  t.add("ckpt.dir", OptionKind::kString, "", "checkpoint directory (empty: RUN_DIR/checkpoints); on a shared file system");
  t.add("ckpt.interval", OptionKind::kInt, "0",
        "write a checkpoint every N steps and at the end (0: only when stopped by SIGTERM/SIGUSR1/SIGINT)");
  t.add("ckpt.keep_last", OptionKind::kInt, "3", "keep the newest K checkpoints (0: all)");
  t.add("ckpt.keep_every", OptionKind::kInt, "0", "also keep, for good, checkpoints whose step is a multiple of N");
  t.add("ckpt.resume", OptionKind::kString, "auto",
        "auto: continue from ckpt.dir's latest checkpoint if there is one; none: start afresh; "
        "or a checkpoint file (or directory) to start from");
  t.add("ckpt.load_weights", OptionKind::kString, "",
        "a checkpoint (file or directory) whose model weights start a run that has no checkpoint to resume: "
        "fine-tuning from `dstrain ckpt import-hf` or another run, with fresh optimizer state from step 0");
  t.add("ckpt.save_final", OptionKind::kBool, "false",
        "at the end, write the whole model (fp32, by Hugging Face name) to RUN_DIR/final_model.h5: a checkpoint of the "
        "model alone, for eval, generate, export-hf and ckpt.load_weights");
}

CkptConfig read_ckpt_config(const Options& o, const std::string& run_dir) {
  CkptConfig c;
  c.dir = o.get_string("ckpt.dir");
  // Left empty in config.ini: the same configuration with another run.dir checkpoints there.
  c.dir_in_run_dir = c.dir.empty();
  if (c.dir_in_run_dir) c.dir = run_dir + "/checkpoints";
  c.interval = o.get_int("ckpt.interval", 0);
  c.keep_last = static_cast<int>(o.get_int("ckpt.keep_last", 0, 1 << 30));
  c.keep_every = static_cast<int>(o.get_int("ckpt.keep_every", 0, 1 << 30));
  const std::string resume = o.get_string("ckpt.resume");
  if (resume.empty()) throw config_error("ckpt.resume", "", "expected auto, none or a checkpoint file");
  c.resume = resume == "auto"   ? ResumeFrom{ResumeFrom::kAuto, ""}
             : resume == "none" ? ResumeFrom{ResumeFrom::kNone, ""}
                                : ResumeFrom{ResumeFrom::kPath, resume};
  c.load_weights = o.get_string("ckpt.load_weights");
  c.save_final = o.get_bool("ckpt.save_final");
  return c;
}

}  // namespace dstrain
