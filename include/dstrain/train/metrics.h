// metrics.jsonl: one JSON object per line, appended and flushed as training goes, so that a
// person (or `dstrain plot`, or a one-line script) can follow a run while it runs.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace dstrain {

class MetricsLog {
 public:
  MetricsLog() = default;  // disabled: every call is a no-op (ranks other than 0)
  explicit MetricsLog(const std::string& path);

  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// "1h 02m", "3m 07s", "12s": durations a person reads at a glance.
std::string format_duration(double seconds);

}  // namespace dstrain
