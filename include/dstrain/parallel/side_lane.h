// DualPipeV's pairs side by side (compute_lane.h): the pair's forward pass runs on a thread of
// its own while the calling thread runs the paired backward pass, so that one micro-batch's
// expert all-to-all waits while the other computes. Each lane notes its waits for the exchange,
// from which the pair learns how much of them the other lane's computation hid.
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "dstrain/parallel/compute_lane.h"

namespace dstrain {

// What one lane did in a pair: its span from start to end, and its waits for communication.
struct LaneTimeline {
  Interval span;
  std::vector<Interval> waits;
};

// Of each lane's waits, the seconds during which the other lane computed (inside its span and
// outside its waits), summed over both: the exchange time the pair hid.
double hidden_wait_seconds(const LaneTimeline& a, const LaneTimeline& b);

// Runs `work` on the calling thread and returns its timeline (the main lane of a pair).
LaneTimeline timed_lane(const std::function<void()>& work);

// Starts `work` at once on a thread of its own, as the side lane, with the caller's LibTorch
// thread state (gradient mode and the like). The destructor waits for it too, so that a failure
// on the main lane does not leave it running.
class SideLane {
 public:
  explicit SideLane(std::function<void()> work);
  ~SideLane();
  SideLane(const SideLane&) = delete;
  SideLane& operator=(const SideLane&) = delete;
  // Waits for the work and rethrows what it threw; returns what the side lane did.
  const LaneTimeline& join();

 private:
  LaneTimeline timeline_;
  std::exception_ptr failure_;
  std::thread thread_;
};

}  // namespace dstrain
