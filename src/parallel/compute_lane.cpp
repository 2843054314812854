#include "dstrain/parallel/compute_lane.h"

#include <atomic>
#include <chrono>

namespace dstrain {
namespace {

thread_local Lane lane = Lane::kMain;
thread_local WaitLog* wait_log = nullptr;
std::atomic<int> side_lanes{0};

}  // namespace

Lane current_lane() { return lane; }

LaneScope::LaneScope(Lane l) : outer_(lane) { lane = l; }
LaneScope::~LaneScope() { lane = outer_; }

bool side_lane_running() { return side_lanes.load(std::memory_order_relaxed) > 0; }
SideLaneRunning::SideLaneRunning() { ++side_lanes; }
SideLaneRunning::~SideLaneRunning() { --side_lanes; }

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

WaitLog::WaitLog() : outer_(wait_log) { wait_log = this; }
WaitLog::~WaitLog() { wait_log = outer_; }

void note_wait(const Interval& wait) {
  if (wait_log) wait_log->waits_.push_back(wait);
}

}  // namespace dstrain
