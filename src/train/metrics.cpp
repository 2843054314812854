#include "dstrain/train/metrics.h"

#include <cmath>
#include <cstdio>

#include "dstrain/core/error.h"

namespace dstrain {

MetricsLog::MetricsLog(const std::string& path) : path_(path), out_(path, std::ios::trunc) {
  if (!out_) throw config_error("run.dir", path, "cannot create the metrics file here");
}

void MetricsLog::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  out_ << record.dump() << '\n';
  out_.flush();
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
