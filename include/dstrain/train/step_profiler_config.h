// debug.profile*: which training steps LibTorch's profiler records, and where the profile goes.
#pragma once

#include <cstdint>
#include <string>

namespace dstrain {

struct StepProfilerConfig {
  std::string prefix;      // empty: no profile
  int64_t first_step = 3;  // the first step profiled
  int64_t steps = 2;       // how many
};

}  // namespace dstrain
