#include "dstrain/train/run_summary.h"

#include <nlohmann/json.hpp>

#include "dstrain/core/log.h"
#include "dstrain/core/text.h"
#include "dstrain/report/metrics.h"
#include "dstrain/report/run_directory.h"

namespace dstrain {

void write_run_summary(const TrainConfig& c, const ParallelContext& parallel, const DevicePlacement& placement,
                       const AdamW& optimizer, const TrainResult& result, bool evaluated, double seconds) {
  const uint64_t tokens = static_cast<uint64_t>(result.consumed_samples) * static_cast<uint64_t>(c.loop.seq_len);
  // After a resume, the time is this process's steps', the tokens the whole run's.
  const std::string steps = result.start_step == 0
                                ? std::to_string(c.loop.steps) + " steps"
                                : step_range_text(result.start_step + 1, c.loop.steps) + " (resumed after step " +
                                      std::to_string(result.start_step) + ")";
  log::info("done: ", steps, " in ", format_duration(seconds), ", ", with_commas(static_cast<double>(tokens)),
            result.start_step == 0 ? " tokens" : " tokens since step 0", " (", with_commas(result.tokens_per_s),
            " tok/s after warm-up); final loss ", result.final_loss,
            evaluated ? ", eval loss " + std::to_string(result.final_eval_loss) : std::string());
  if (parallel.world_rank() != 0) return;
  nlohmann::json summary = {{"steps", c.loop.steps},
                            {"start_step", result.start_step},
                            {"tokens", tokens},
                            {"seconds", seconds},
                            {"tokens_per_s", result.tokens_per_s},
                            {"final_loss", result.final_loss},
                            {"param_digest", result.param_digest},
                            {"precision", name_of(precision_names(), c.loop.precision)},
                            {"device", placement.name},
                            {"layout",
                             {{"tp", parallel.grid().size(Group::kTp)},
                              {"cp", parallel.grid().size(Group::kCp)},
                              {"dp", parallel.grid().size(Group::kDp)},
                              {"pp", parallel.grid().size(Group::kPp)},
                              {"ep", parallel.grid().size(Group::kEp)},
                              {"order", parallel.grid().order()},
                              {"schedule", schedule_name(c.pipeline.schedule)},
                              {"virtual_stages", c.pipeline.virtual_stages},
                              {"zero", c.optim.zero}}}};
  summary["optimizer_state_bytes"] = optimizer.state_bytes();  // rank 0's
  if (evaluated) summary["final_eval_loss"] = result.final_eval_loss;
  if (result.mfu > 0) summary["mfu"] = result.mfu;
  if (result.peak_memory_bytes > 0) summary["peak_memory_bytes"] = result.peak_memory_bytes;
  summary["peak_activation_bytes"] = result.peak_activation_bytes;  // the largest rank's
  summary["step_kept_bytes"] = result.step_kept_bytes;
  summary["recompute"] = name_of(recompute_names(), c.loop.recompute);
  write_summary_file(c.run.dir, summary);
}

}  // namespace dstrain
