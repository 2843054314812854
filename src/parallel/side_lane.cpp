#include "dstrain/parallel/side_lane.h"

#include <ATen/ThreadLocalState.h>

#include <algorithm>

namespace dstrain {
namespace {

// The parts of `span` outside `waits` (in order), in order.
std::vector<Interval> outside(const Interval& span, const std::vector<Interval>& waits) {
  std::vector<Interval> parts;
  double at = span.start;
  for (const Interval& w : waits) {
    if (w.start > at) parts.push_back({at, std::min(w.start, span.end)});
    at = std::max(at, w.end);
    if (at >= span.end) return parts;
  }
  if (at < span.end) parts.push_back({at, span.end});
  return parts;
}

// The length of the intersection of two lists of disjoint intervals, each in order.
double overlap(const std::vector<Interval>& x, const std::vector<Interval>& y) {
  double total = 0;
  for (size_t i = 0, j = 0; i < x.size() && j < y.size();) {
    total += std::max(0.0, std::min(x[i].end, y[j].end) - std::max(x[i].start, y[j].start));
    (x[i].end < y[j].end ? i : j)++;
  }
  return total;
}

std::vector<Interval> in_order(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end(), [](const Interval& x, const Interval& y) { return x.start < y.start; });
  return intervals;
}

}  // namespace

double hidden_wait_seconds(const LaneTimeline& a, const LaneTimeline& b) {
  const std::vector<Interval> a_waits = in_order(a.waits), b_waits = in_order(b.waits);
  return overlap(a_waits, outside(b.span, b_waits)) + overlap(b_waits, outside(a.span, a_waits));
}

LaneTimeline timed_lane(const std::function<void()>& work) {
  LaneTimeline timeline;
  const WaitLog log;
  timeline.span.start = steady_seconds();
  work();
  timeline.span.end = steady_seconds();
  timeline.waits = log.waits();
  return timeline;
}

SideLane::SideLane(std::function<void()> work) {
  const at::ThreadLocalState caller;
  thread_ = std::thread([this, work = std::move(work), caller] {
    const at::ThreadLocalStateGuard state(caller);
    const LaneScope lane(Lane::kSide);
    const SideLaneRunning running;
    try {
      timeline_ = timed_lane(work);
    } catch (...) {
      failure_ = std::current_exception();
    }
  });
}

SideLane::~SideLane() {
  if (thread_.joinable()) thread_.join();
}

const LaneTimeline& SideLane::join() {
  if (thread_.joinable()) thread_.join();
  if (failure_) std::rethrow_exception(failure_);
  return timeline_;
}

}  // namespace dstrain
