// Profiles training steps (debug.profile, `dstrain bench step --bench.profile`) with LibTorch's
// profiler: from the start of the first step to the end of the last, host operations and, on a
// GPU, the device's kernels; then every rank writes its profile (report/step_profile.h): the
// table as PREFIX.md (rank 0 also logs it) and a Chrome trace as PREFIX.trace.json, ranks other
// than 0 with .rankR before the suffix.
#pragma once

#include <cstdint>
#include <string>

#include "dstrain/core/torch_api.h"
#include "dstrain/train/step_profiler_config.h"

namespace dstrain {

// Throws Error(kUsage) naming `option` (= prefix) when the profile's files cannot be written there.
void check_profile_prefix(const std::string& option, const std::string& prefix);

class StepProfiler {
 public:
  // Throws Error(kUsage) naming debug.profile when its files cannot be written.
  StepProfiler(StepProfilerConfig config, int world_rank, const torch::Device& device);
  ~StepProfiler();  // a profile still running (a run that stopped early) is dropped
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;
  void before_step(int64_t step);
  void after_step(int64_t step);  // writes the files after the last profiled step

 private:
  void write_profile();
  StepProfilerConfig config_;
  int world_rank_;
  torch::Device device_;
  bool running_ = false;
};

}  // namespace dstrain
