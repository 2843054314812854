#include "dstrain/report/metrics.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "dstrain/core/error.h"

namespace dstrain {

MetricsLog::MetricsLog(const std::string& path, int64_t resumed_step) : path_(path) {
  std::vector<std::string> kept;
  if (resumed_step > 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_object() && record.value("step", INT64_MAX) <= resumed_step) kept.push_back(line);
    }
  }
  out_.open(path, std::ios::trunc);
  if (!out_) throw config_error("run.dir", path, "cannot create the metrics file here");
  for (const std::string& line : kept) out_ << line << '\n';
  out_.flush();
}

void MetricsLog::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

std::string with_commas(double value) {
  std::string digits = std::to_string(std::llround(value));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long total = std::lround(seconds);
  char text[32];
  if (total >= 3600)
    std::snprintf(text, sizeof text, "%ldh %02ldm", total / 3600, (total % 3600) / 60);
  else if (total >= 60)
    std::snprintf(text, sizeof text, "%ldm %02lds", total / 60, total % 60);
  else
    std::snprintf(text, sizeof text, "%lds", total);
  return text;
}

}  // namespace dstrain
