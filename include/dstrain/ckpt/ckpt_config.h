// The [ckpt] section: what a run saves of its model.
#pragma once

#include "dstrain/core/config.h"

namespace dstrain {

struct CkptConfig {
  bool save_final = false;  // RUN_DIR/final_model.h5 at the end
};

void add_ckpt_options(OptionTable& table);
CkptConfig read_ckpt_config(const Options& options);

}  // namespace dstrain
