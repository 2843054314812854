// Linear warmup to the peak (step s of W trains at max_lr × s / W, so the first step already
// learns), then cosine decay that reaches min_lr at decay_steps, then min_lr.
#pragma once

#include <cstdint>

namespace dstrain {

struct LrSchedule {
  double max_lr, min_lr;
  int64_t warmup_steps, decay_steps;

  // Learning rate of step `step` (1-based: the first update is step 1); a fraction of a step
  // where the schedule counts tokens (optim.schedule_unit) and steps are smaller than global_batch.
  double at(double step) const;
};

}  // namespace dstrain
