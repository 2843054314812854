#include "dstrain/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace dstrain {

double LrSchedule::at(double step) const {
  if (warmup_steps > 0 && step <= warmup_steps)
    return max_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (step >= decay_steps) return min_lr;  // also when decay_steps = warmup_steps: no decay, the floor
  double progress = (step - static_cast<double>(warmup_steps)) / static_cast<double>(decay_steps - warmup_steps);
  progress = std::clamp(progress, 0.0, 1.0);
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace dstrain
