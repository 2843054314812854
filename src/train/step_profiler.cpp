#include "dstrain/train/step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/report/step_profile.h"

namespace dstrain {

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

constexpr size_t kKernelRows = 30;

std::string profile_path(const std::string& prefix, int rank, const std::string& suffix) {
  return prefix + (rank == 0 ? "" : ".rank" + std::to_string(rank)) + suffix;
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  return static_cast<bool>(out.flush());
}

std::set<ActivityType> activities(bool on_gpu) {
  std::set<ActivityType> chosen = {ActivityType::CPU};
  if (on_gpu) chosen.insert(ActivityType::CUDA);
  return chosen;
}

ProfiledEvent profiled(const profiler::KinetoEvent& e) {
  ProfiledEvent event;
  event.name = e.name();
  event.on_device = e.deviceType() != c10::DeviceType::CPU;
  event.thread = event.on_device ? static_cast<uint64_t>(e.deviceResourceId()) : e.startThreadId();
  event.start_us = compat::profiled_start_us(e);
  event.duration_us = compat::profiled_duration_us(e);
  event.correlation = e.correlationId();
  if (event.on_device) event.launched_by = e.linkedCorrelationId();
  event.sequence = e.sequenceNr();
  event.forward_thread = e.fwdThreadId();
  return event;
}

}  // namespace

void check_profile_prefix(const std::string& option, const std::string& prefix) {
  const std::string dir = files::parent(prefix).empty() ? "." : files::parent(prefix);
  std::string why;
  if (!files::can_write_in(dir, &why)) throw config_error(option, prefix, "cannot write in " + dir + " (" + why + ")");
}

StepProfiler::StepProfiler(StepProfilerConfig config, int world_rank, const torch::Device& device)
    : config_(std::move(config)), world_rank_(world_rank), device_(device) {
  if (config_.prefix.empty()) return;
  check_profile_prefix("debug.profile", config_.prefix);  // found out now, not after the steps it was to profile
  profiler::prepareProfiler(ProfilerConfig(ProfilerState::KINETO), activities(device_.is_cuda()));
}

StepProfiler::~StepProfiler() {
  if (running_) profiler::disableProfiler();
}

void StepProfiler::before_step(int64_t step) {
  if (config_.prefix.empty() || step != config_.first_step) return;
  profiler::enableProfiler(ProfilerConfig(ProfilerState::KINETO), activities(device_.is_cuda()));
  running_ = true;
}

void StepProfiler::after_step(int64_t step) {
  if (!running_ || step != config_.first_step + config_.steps - 1) return;
  write_profile();
}

void StepProfiler::write_profile() {
  accel::synchronize(device_);  // the steps' kernels end inside the profile
  running_ = false;
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  std::vector<ProfiledEvent> events;
  events.reserve(result->events().size());
  for (const profiler::KinetoEvent& e : result->events()) events.push_back(profiled(e));
  const std::string table =
      step_profile_markdown(tabulate_step_profile(events, config_.steps), kKernelRows);
  const std::string table_path = profile_path(config_.prefix, world_rank_, ".md");
  const std::string trace_path = profile_path(config_.prefix, world_rank_, ".trace.json");
  if (!write_file(table_path, table) || !write_file(trace_path, chrome_trace(events, world_rank_).dump() + "\n")) {
    log::warning("debug.profile: could not write ", table_path, " or ", trace_path);
    return;
  }
  if (world_rank_ == 0)
    log::info("profile of steps ", config_.first_step, " to ", config_.first_step + config_.steps - 1, " (",
              table_path, ", trace ", trace_path, "):\n", table);
}

}  // namespace dstrain
