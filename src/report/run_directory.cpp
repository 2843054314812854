#include "dstrain/report/run_directory.h"

#include <fstream>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/report/metrics.h"
#include "dstrain/report/tensorboard.h"

namespace dstrain {
namespace {

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out) throw config_error("run.dir", path, "cannot write this file");
}

}  // namespace

std::vector<std::unique_ptr<ReportSink>> open_run_files(const std::string& dir, const std::string& config_text,
                                                        int64_t start_step) {
  std::string why;
  if (!files::make_directories(dir, &why))
    throw config_error("run.dir", dir, "cannot create this directory (" + why + ")");
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

void write_summary_file(const std::string& dir, const nlohmann::json& summary) {
  write_text_file(dir + "/summary.json", summary.dump(2) + "\n");
}

std::string run_files_text(const std::string& dir, bool final_model) {
  return "metrics: " + dir + "/metrics.jsonl  config: " + dir + "/config.ini  summary: " + dir + "/summary.json" +
         (final_model ? "  model: " + dir + "/final_model.h5" : "");
}

}  // namespace dstrain
