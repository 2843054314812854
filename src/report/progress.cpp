#include "dstrain/report/progress.h"

#include <cmath>
#include <cstdio>

#include "dstrain/core/log.h"
#include "dstrain/report/metrics.h"

namespace dstrain {

std::string progress_text(int64_t step, int64_t total_steps, double tokens_per_s, double eta_seconds, int width) {
  const double done = total_steps > 0 ? static_cast<double>(step) / static_cast<double>(total_steps) : 1.0;
  const int filled = static_cast<int>(std::floor(done * width));
  std::string bar = "[";
  for (int i = 0; i < width; ++i) bar += i < filled ? "#" : "-";
  bar += "]";
  const std::string total = std::to_string(total_steps);
  char text[160];
  std::snprintf(text, sizeof text, "%s %*lld/%s | %s tok/s | ETA %s", bar.c_str(), static_cast<int>(total.size()),
                static_cast<long long>(step), total.c_str(), with_commas(tokens_per_s).c_str(),
                format_duration(eta_seconds).c_str());
  return text;
}

ProgressLine::ProgressLine(int64_t start_step, int64_t total_steps)
    : start_step_(start_step), total_steps_(total_steps), start_(Clock::now()), last_draw_(start_) {}

ProgressLine::~ProgressLine() { log::set_status(""); }

void ProgressLine::step_done(int64_t step, double tokens) {
  tokens_ += tokens;
  const Clock::time_point now = Clock::now();
  // Redrawing is cheap, but a terminal that scrolls a remote log should not get 100 lines a second.
  if (step < total_steps_ && now - last_draw_ < std::chrono::milliseconds(250)) return;
  last_draw_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double steps = static_cast<double>(step - start_step_);
  const double per_step = steps > 0 ? seconds / steps : 0.0;
  log::set_status(progress_text(step, total_steps_, seconds > 0 ? tokens_ / seconds : 0.0,
                                per_step * static_cast<double>(total_steps_ - step)));
}

}  // namespace dstrain
