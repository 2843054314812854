// A rank computes on one thread, except in DualPipeV's pairs (parallel/side_lane.h): there the
// forward pass of one micro-batch runs on a second thread, the side lane, beside the main
// thread's backward pass of another, so that while one waits for its expert all-to-all the other
// computes (DeepSeek-V3 §3.2.1).
//
// The collectives of one communicator must start in the same order on every member. Two threads
// that shared a group would interleave theirs in an order that differs from rank to rank, so a
// group both lanes use has a communicator for each (LaneGroups), and a thread knows its lane.
#pragma once

#include <vector>

#include "dstrain/parallel/communicator.h"

namespace dstrain {

enum class Lane { kMain = 0, kSide = 1 };

// This thread's lane: kMain unless a LaneScope says otherwise.
Lane current_lane();

class LaneScope {
 public:
  explicit LaneScope(Lane lane);
  ~LaneScope();
  LaneScope(const LaneScope&) = delete;
  LaneScope& operator=(const LaneScope&) = delete;

 private:
  Lane outer_;
};

// Whether a side lane is running now (on this rank): a wait then leaves the core to the other
// lane at once rather than spinning first.
bool side_lane_running();
class SideLaneRunning {  // while it lives, side_lane_running() holds
 public:
  SideLaneRunning();
  ~SideLaneRunning();
  SideLaneRunning(const SideLaneRunning&) = delete;
  SideLaneRunning& operator=(const SideLaneRunning&) = delete;
};

// One group of ranks, a communicator for each lane. Without a side communicator (a backend that
// has no side lane) both lanes get the main one.
class LaneGroups {
 public:
  LaneGroups() = default;
  LaneGroups(Communicator* main, Communicator* side) : main_(main), side_(side ? side : main) {}
  // The calling thread's communicator (null when no group was handed in).
  Communicator* current() const { return current_lane() == Lane::kSide ? side_ : main_; }
  Communicator* main() const { return main_; }
  bool has_side() const { return side_ != main_; }

 private:
  Communicator* main_ = nullptr;
  Communicator* side_ = nullptr;
};

// A span of wall time, in seconds of the steady clock.
struct Interval {
  double start = 0, end = 0;
  double length() const { return end - start; }
};
double steady_seconds();

// While one lives, the waits for communication that this thread notes (note_wait) are kept in
// it: how a pair learns how much of its exchanges the other lane's computation hid.
class WaitLog {
 public:
  WaitLog();
  ~WaitLog();
  WaitLog(const WaitLog&) = delete;
  WaitLog& operator=(const WaitLog&) = delete;
  const std::vector<Interval>& waits() const { return waits_; }

 private:
  friend void note_wait(const Interval& wait);
  WaitLog* outer_;
  std::vector<Interval> waits_;
};

// A wait of this thread for communication, kept by its WaitLog if one lives.
void note_wait(const Interval& wait);

}  // namespace dstrain
