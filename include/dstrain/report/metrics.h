// metrics.jsonl: one JSON object per line, appended and flushed as training goes, so that a
// person (or `dstrain plot`, or a one-line script) can follow a run while it runs.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "dstrain/report/report_sink.h"

namespace dstrain {

class MetricsLog : public ReportSink {
 public:
  MetricsLog() = default;  // disabled: every call is a no-op (ranks other than 0)
  // A new file; or, for a run resumed at `resumed_step` > 0, the existing one without the records
  // of later steps (which the resumed run writes again), appended to.
  explicit MetricsLog(const std::string& path, int64_t resumed_step = 0);

  void write(const nlohmann::json& record) override;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// "1h 02m", "3m 07s", "12s": durations a person reads at a glance.
std::string format_duration(double seconds);
// "1,234,567": a count rounded to an integer, its thousands apart.
std::string with_commas(double value);

}  // namespace dstrain
