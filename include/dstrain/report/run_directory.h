// The files of a run directory (run.dir), written by the reporting rank: config.ini (the
// effective configuration), metrics.jsonl and the TensorBoard event files as the step report's
// sinks, and summary.json at the end.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "dstrain/report/report_sink.h"

namespace dstrain {

// Makes `dir`, writes config.ini, and opens metrics.jsonl and a TensorBoard event file for a run
// that continues after `start_step` (0: a new run, which replaces an earlier run's logs, with a
// warning). Throws Error(kUsage) naming run.dir when it cannot.
std::vector<std::unique_ptr<ReportSink>> open_run_files(const std::string& dir, const std::string& config_text,
                                                        int64_t start_step);

// summary.json, as `summary` says.
void write_summary_file(const std::string& dir, const nlohmann::json& summary);

// "metrics: DIR/metrics.jsonl  config: ...  summary: ...  model: ...": where the run's files are.
std::string run_files_text(const std::string& dir, bool final_model);

}  // namespace dstrain
