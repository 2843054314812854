#include "dstrain/ckpt/ckpt_config.h"

namespace dstrain {

void add_ckpt_options(OptionTable& t) {
  t.add("ckpt.save_final", OptionKind::kBool, "false",
        "at the end, write every parameter (fp32, by Hugging Face name) to RUN_DIR/final_model.h5");
}

CkptConfig read_ckpt_config(const Options& o) {
  CkptConfig c;
  c.save_final = o.get_bool("ckpt.save_final");
  return c;
}

}  // namespace dstrain
