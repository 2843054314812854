#include "dstrain/dist/compute_lane.h"

#include <chrono>

namespace dstrain {
namespace {

thread_local Lane lane = Lane::kMain;
thread_local WaitLog* wait_log = nullptr;

}  // namespace

Lane current_lane() { return lane; }

LaneScope::LaneScope(Lane l) : outer_(lane) { lane = l; }
LaneScope::~LaneScope() { lane = outer_; }

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

WaitLog::WaitLog() : outer_(wait_log) { wait_log = this; }
WaitLog::~WaitLog() { wait_log = outer_; }

void note_wait(const Interval& wait) {
  if (wait_log) wait_log->waits_.push_back(wait);
}

}  // namespace dstrain
