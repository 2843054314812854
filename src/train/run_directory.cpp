#include "dstrain/train/run_directory.h"

#include <fstream>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/core/text.h"
#include "dstrain/train/metrics.h"
#include "dstrain/train/tensorboard.h"

namespace dstrain {
namespace {

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out) throw config_error("run.dir", path, "cannot write this file");
}

}  // namespace

std::vector<std::unique_ptr<ReportSink>> open_run_files(const TrainConfig& config, const std::string& config_text,
                                                        int64_t start_step) {
  const std::string& dir = config.run.dir;
  std::string why;
  if (!files::make_directories(dir, &why)) throw config_error("run.dir", dir, "cannot create this directory (" + why + ")");
  if (start_step == 0 && files::is_regular_file(dir + "/metrics.jsonl"))
    log::warning("run.dir = ", dir, " holds the logs of an earlier run, and this one starts at step 0: it replaces ",
                 "their config.ini, metrics.jsonl and summary.json; their TensorBoard files",
                 files::exists(dir + "/final_model.h5") ? " and final_model.h5" : "", " stay");
  write_text_file(dir + "/config.ini", config_text);
  std::vector<std::unique_ptr<ReportSink>> sinks;
  sinks.push_back(std::make_unique<MetricsLog>(dir + "/metrics.jsonl", start_step));
  sinks.push_back(std::make_unique<TensorBoardLog>(dir, start_step));
  return sinks;
}

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
  if (parallel.world_rank != 0) return;
  nlohmann::json summary = {{"steps", c.loop.steps},
                            {"start_step", result.start_step},
                            {"tokens", tokens},
                            {"seconds", seconds},
                            {"tokens_per_s", result.tokens_per_s},
                            {"final_loss", result.final_loss},
                            {"param_digest", result.param_digest},
                            {"precision", c.loop.precision},
                            {"device", placement.name},
                            {"layout",
                             {{"dp", parallel.grid.dp()},
                              {"pp", parallel.grid.pp()},
                              {"ep", c.parallel.ep},
                              {"schedule", c.parallel.schedule},
                              {"virtual_stages", c.parallel.virtual_stages},
                              {"zero", c.optim.zero}}}};
  summary["optimizer_state_bytes"] = optimizer.state_bytes();  // rank 0's
  if (evaluated) summary["final_eval_loss"] = result.final_eval_loss;
  if (result.mfu > 0) summary["mfu"] = result.mfu;
  if (result.peak_memory_bytes > 0) summary["peak_memory_bytes"] = result.peak_memory_bytes;
  summary["peak_activation_bytes"] = result.peak_activation_bytes;  // the largest rank's
  summary["recompute"] = c.loop.recompute;
  const std::string path = c.run.dir + "/summary.json";
  write_text_file(path, summary.dump(2) + "\n");
}

std::string run_files_text(const TrainConfig& c) {
  return "metrics: " + c.run.dir + "/metrics.jsonl  config: " + c.run.dir + "/config.ini  summary: " + c.run.dir +
         "/summary.json" + (c.ckpt.save_final ? "  model: " + c.run.dir + "/final_model.h5" : "");
}

}  // namespace dstrain
