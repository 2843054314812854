// Linear warmup from 0 to the peak, then cosine decay to min_lr, then min_lr.
#pragma once

#include <cstdint>

namespace dstrain {

struct LrSchedule {
  double max_lr, min_lr;
  int64_t warmup_steps, decay_steps;

  // Learning rate of step `step` (1-based: the first update is step 1).
  double at(int64_t step) const;
};

}  // namespace dstrain
