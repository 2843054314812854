// Training progress for a person at a terminal: a live line with a bar, step/total, tokens/s and
// the ETA, redrawn in place after every step (log::set_status; a few times a second at most).
// When the output is a file (a Slurm log) no live line is drawn: the log line of every
// log.interval steps, which says the same, is the periodic plain report.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dstrain {

class ProgressLine {
 public:
  // Steps (start_step, total_steps] remain.
  ProgressLine(int64_t start_step, int64_t total_steps);
  ~ProgressLine();  // takes the line away
  void step_done(int64_t step, double tokens);  // `tokens`: what the step trained

 private:
  using Clock = std::chrono::steady_clock;
  int64_t start_step_, total_steps_;
  double tokens_ = 0;  // trained since the start
  Clock::time_point start_, last_draw_;
};

// "[##########··········]  10/20 | 1,234 tok/s | ETA 5s": the line, `width` characters of bar.
std::string progress_text(int64_t step, int64_t total_steps, double tokens_per_s, double eta_seconds, int width = 30);

}  // namespace dstrain
