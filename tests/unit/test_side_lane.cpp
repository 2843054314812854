// DualPipeV's side lane (parallel/side_lane.h, parallel/compute_lane.h): the share of a pair's
// exchange waits that the other lane's computation hid, against intervals worked out by hand;
// the side thread's lane, LibTorch state, noted waits and errors.
#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

#include "dstrain/core/torch_api.h"
#include "dstrain/parallel/side_lane.h"

using namespace dstrain;

TEST(SideLane, HiddenWaitsAreThoseDuringWhichTheOtherLaneComputed) {
  // A computes [0,2] [4,6] [7,10]; B computes [1,3] [5,9].
  const LaneTimeline a{{0, 10}, {{6, 7}, {2, 4}}};  // (waits in any order)
  const LaneTimeline b{{1, 9}, {{3, 5}}};
  // A's [2,4] is hidden over [2,3], its [6,7] wholly; B's [3,5] over [4,5].
  EXPECT_DOUBLE_EQ(hidden_wait_seconds(a, b), 1 + 1 + 1);
  EXPECT_DOUBLE_EQ(hidden_wait_seconds(b, a), 3);
}

TEST(SideLane, WaitsAtTheSameTimeOrAfterTheOtherLaneEndedHideNothing) {
  EXPECT_DOUBLE_EQ(hidden_wait_seconds({{0, 5}, {{0, 5}}}, {{0, 5}, {{0, 5}}}), 0);
  // B waits [1,5]; A computed until 2 and then had ended.
  EXPECT_DOUBLE_EQ(hidden_wait_seconds({{0, 2}, {}}, {{0, 6}, {{1, 5}}}), 1);
  EXPECT_DOUBLE_EQ(hidden_wait_seconds({{0, 4}, {}}, {{0, 4}, {}}), 0);
}

TEST(SideLane, RunsOnAThreadOfItsOwnAsTheSideLaneWithTheCallersGradMode) {
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  Lane lane = Lane::kMain;
  bool grad_enabled = true;
  {
    torch::NoGradGuard no_grad;
    SideLane side([&] {
      ran_on = std::this_thread::get_id();
      lane = current_lane();
      grad_enabled = torch::GradMode::is_enabled();
      note_wait({1, 3});
      note_wait({4, 5});
    });
    const LaneTimeline& timeline = side.join();
    ASSERT_EQ(timeline.waits.size(), 2u);
    EXPECT_DOUBLE_EQ(timeline.waits[1].start, 4);
    EXPECT_LE(timeline.span.start, timeline.span.end);
  }
  EXPECT_NE(ran_on, caller);
  EXPECT_EQ(lane, Lane::kSide);
  EXPECT_FALSE(grad_enabled);
  EXPECT_EQ(current_lane(), Lane::kMain);
}

TEST(SideLane, WaitsOutsideAWaitLogAreNotKeptAndTheMainLaneKeepsItsOwn) {
  note_wait({0, 1});  // no log: dropped
  const LaneTimeline main = timed_lane([] { note_wait({2, 3}); });
  ASSERT_EQ(main.waits.size(), 1u);
  EXPECT_DOUBLE_EQ(main.waits[0].end, 3);
}

TEST(SideLane, AnErrorOnTheSideLaneReachesTheCallerAtJoin) {
  SideLane side([] { throw std::runtime_error("side lane failed"); });
  EXPECT_THROW(
      {
        try {
          side.join();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "side lane failed");
          throw;
        }
      },
      std::runtime_error);
}
