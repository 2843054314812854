// The files of a run directory (run.dir), written by the reporting rank: config.ini (the
// effective configuration), metrics.jsonl and the TensorBoard event files as the step report's
// sinks, and summary.json at the end.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dstrain/parallel/device.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/train/step_report.h"
#include "dstrain/train/train_config.h"
#include "dstrain/train/trainer.h"

namespace dstrain {

// Makes run.dir, writes config.ini, and opens metrics.jsonl and a TensorBoard event file for a run
// that continues after `start_step` (0: a new run, which replaces an earlier run's logs, with a
// warning). Throws Error(kUsage) naming run.dir when it cannot.
std::vector<std::unique_ptr<ReportSink>> open_run_files(const TrainConfig& config, const std::string& config_text,
                                                        int64_t start_step);

// The run's last words: the "done" line, and on the reporting rank summary.json.
void write_run_summary(const TrainConfig& config, const ParallelContext& parallel, const DevicePlacement& placement,
                       const AdamW& optimizer, const TrainResult& result, bool evaluated, double seconds);
// "metrics: DIR/metrics.jsonl  config: ...  summary: ...  model: ...": where the run's files are.
std::string run_files_text(const TrainConfig& config);

}  // namespace dstrain
