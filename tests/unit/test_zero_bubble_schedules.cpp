// The zero-bubble schedules as data (pipeline/schedule.h): every micro-batch's forward, input
// gradient and weight gradient once per chunk and in that order, no deadlock, and the simulator
// against each paper's bubble formula (Qi et al. 2024 for ZB-H1 and ZB-V; deepseek-ai/DualPipe
// for DualPipeV) for several stage and micro-batch counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "dstrain/core/error.h"
#include "dstrain/pipeline/channels.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/simulator.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;

namespace {

// Per-chunk times of F, B (input gradient) and W, as the papers write them.
SimulationCosts per_chunk(const Schedule& s, double f, double b, double w) {
  const double v = s.virtual_stages;
  return SimulationCosts{f * v, (b + w) * v, w * v, 0.0, {}};
}

void expect_complete(const Schedule& s) {
  for (int stage = 0; stage < s.pp; ++stage) {
    // Position of each (kind, micro-batch, chunk) in the stage's list.
    std::map<std::tuple<ActionKind, int, int>, int> at;
    int position = 0;
    for (const Action& a : s.stages[stage]) {
      ++position;
      if (!a.is_compute()) continue;
      EXPECT_TRUE(at.emplace(std::make_tuple(a.kind, a.microbatch, a.chunk), position).second)
          << schedule_name(s.kind) << ": stage " << stage << " repeats an action of micro-batch " << a.microbatch;
    }
    ASSERT_EQ(at.size(), size_t(3 * s.microbatches * s.virtual_stages))
        << schedule_name(s.kind) << " p=" << s.pp << " m=" << s.microbatches << " stage " << stage;
    for (int mb = 0; mb < s.microbatches; ++mb)
      for (int c = 0; c < s.virtual_stages; ++c) {
        const int f = at[{ActionKind::kForward, mb, c}], b = at[{ActionKind::kBackward, mb, c}],
                  w = at[{ActionKind::kWeight, mb, c}];
        EXPECT_TRUE(f < b && b < w) << schedule_name(s.kind) << " stage " << stage << " micro-batch " << mb;
      }
  }
}

double max_idle(const SimulationResult& r) { return *std::max_element(r.idle.begin(), r.idle.end()); }

}  // namespace

TEST(ZeroBubbleSchedules, EveryActionOnceInOrderAndNoDeadlock) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 7, 8, 16, 17}) {
      for (ScheduleKind kind : {ScheduleKind::kZbH1, ScheduleKind::kZbV, ScheduleKind::kDualPipeV}) {
        if (kind == ScheduleKind::kDualPipeV && m < 2 * p) continue;
        const int v = kind == ScheduleKind::kZbH1 ? 1 : 2;
        check_schedule(kind, p, v, m);
        const Schedule s = make_schedule(kind, p, v, m);
        expect_complete(s);
        for (auto costs : {per_chunk(s, 1, 1, 1), per_chunk(s, 2, 3, 1), per_chunk(s, 1, 1.5, 0.7)}) {
          const SimulationResult r = simulate(s, costs);
          EXPECT_FALSE(r.deadlock) << schedule_name(kind) << " p=" << p << " m=" << m << ": " << r.problem;
        }
      }
    }
  }
}

// Where sends do not wait, each channel's receives must come in the order its sends go, for NCCL,
// which has no tags, to match them: a stage that posts two activations' receives the other way
// round is reported.
TEST(ZeroBubbleSchedules, ReceivesOutOfTheirChannelsOrderAreReported) {
  Schedule s = make_schedule(ScheduleKind::kZbH1, 2, 1, 2);
  ASSERT_FALSE(simulate(s, per_chunk(s, 1, 1, 1)).deadlock);
  std::vector<Action*> receives;
  for (Action& a : s.stages[1])
    if (a.kind == ActionKind::kRecvActivation) receives.push_back(&a);
  ASSERT_EQ(receives.size(), 2u);
  std::swap(receives[0]->microbatch, receives[1]->microbatch);
  const SimulationResult r = simulate(s, per_chunk(s, 1, 1, 1));
  EXPECT_TRUE(r.deadlock);
  EXPECT_EQ(r.problem, "stage 1: receive activation of micro-batch 1, chunk 0, peer stage 0 is posted in another "
                       "order than stage 0 sends its channel's transfers");
}

// ZB-H1: (p − 1)(F + B − W) idle against 1F1B's (p − 1)(F + B + W), where W ≤ F and W ≤ B (the
// paper's assumption), for 1F1B's peak memory: p micro-batches on every stage.
TEST(ZeroBubbleSchedules, ZbH1BubbleIsThePapersFormula) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, p + 1, 2 * p, 4 * p + 3}) {
      for (auto [f, b, w] : {std::make_tuple(1.0, 1.0, 1.0), std::make_tuple(2.0, 2.0, 1.0),
                             std::make_tuple(1.5, 2.0, 1.0), std::make_tuple(1.0, 2.0, 0.5)}) {
        const Schedule zb = make_schedule(ScheduleKind::kZbH1, p, 1, m);
        const SimulationResult r = simulate(zb, per_chunk(zb, f, b, w));
        ASSERT_FALSE(r.deadlock) << r.problem;
        EXPECT_NEAR(r.makespan - m * (f + b + w), (p - 1) * (f + b - w), 1e-9) << "p=" << p << " m=" << m;
        for (int s = 0; s < p; ++s) EXPECT_EQ(r.peak_live[s], p) << "stage " << s;
        const Schedule one = make_schedule(ScheduleKind::kOneFOneB, p, 1, m);
        const SimulationResult plain = simulate(one, per_chunk(one, f, b + w, 0));
        EXPECT_NEAR(plain.makespan - m * (f + b + w), (p - 1) * (f + b + w), 1e-9);
        EXPECT_EQ(plain.peak_live[0], p);
      }
    }
  }
}

// ZB-V: with equal F, B and W, no stage waits once it has started (only the p − 1 of the start
// remain), for 1F1B's peak memory (2p half-size chunks), when m ≥ 2p − 1.
TEST(ZeroBubbleSchedules, ZbvLeavesOnlyTheStartWithEqualCosts) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {2 * p - 1, 2 * p, 3 * p + 1, 6 * p}) {
      const Schedule s = make_schedule(ScheduleKind::kZbV, p, 2, m);
      const SimulationResult r = simulate(s, per_chunk(s, 1, 1, 1));
      ASSERT_FALSE(r.deadlock) << r.problem;
      EXPECT_NEAR(r.makespan, 6.0 * m + (p - 1), 1e-9) << "p=" << p << " m=" << m;
      for (int stage = 0; stage < p; ++stage) {
        EXPECT_NEAR(r.idle[stage], p - 1, 1e-9) << "p=" << p << " m=" << m << " stage " << stage;
        EXPECT_LE(r.peak_live[stage], 2 * p) << "stage " << stage;
      }
    }
  }
}

// DualPipeV: (p − 1)(F&B + B − 3W) with B the whole backward pass and F&B a forward paired with
// one (here not overlapped: F + B), where the input gradient takes as long as the forward.
TEST(ZeroBubbleSchedules, DualPipeVBubbleIsDeepSeeksFormula) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {2 * p, 2 * p + 1, 3 * p, 5 * p}) {
      for (auto [f, w] : {std::make_pair(1.0, 1.0), std::make_pair(2.0, 1.0), std::make_pair(2.0, 0.5)}) {
        const double b = f, whole = b + w, paired = f + whole;
        const Schedule s = make_schedule(ScheduleKind::kDualPipeV, p, 2, m);
        const SimulationResult r = simulate(s, per_chunk(s, f, b, w));
        ASSERT_FALSE(r.deadlock) << r.problem;
        EXPECT_NEAR(max_idle(r), (p - 1) * (paired + whole - 3 * w), 1e-9) << "p=" << p << " m=" << m << " f=" << f;
      }
    }
  }
}

// DualPipeV's pairs may run side by side (side_lane.h) only if neither half needs the other: the
// paired backward pass is of the other chunk and of a micro-batch whose forward on that chunk is
// already done, and the next action after it is not its own weight gradient's of another pass.
TEST(ZeroBubbleSchedules, DualPipeVPairsAForwardWithABackwardThatDoesNotNeedIt) {
  for (int p : {2, 3, 4}) {
    for (int m : {2 * p, 3 * p + 1}) {
      const Schedule s = make_schedule(ScheduleKind::kDualPipeV, p, 2, m);
      for (int stage = 0; stage < p; ++stage) {
        const std::vector<Action>& actions = s.stages[stage];
        int pairs = 0;
        for (size_t i = 0; i < actions.size(); ++i) {
          if (!actions[i].paired) continue;
          ++pairs;
          const Action &f = actions[i], &b = actions.at(i + 1);
          ASSERT_EQ(f.kind, ActionKind::kForward);
          ASSERT_EQ(b.kind, ActionKind::kBackward) << "stage " << stage << " action " << i;
          EXPECT_NE(b.chunk, f.chunk);
          const auto earlier_forward = std::find(actions.begin(), actions.begin() + static_cast<std::ptrdiff_t>(i),
                                                 Action{ActionKind::kForward, b.microbatch, b.chunk});
          EXPECT_NE(earlier_forward, actions.begin() + static_cast<std::ptrdiff_t>(i))
              << "p=" << p << " m=" << m << " stage " << stage << ": a paired backward before its forward";
        }
        // Two pairs in each round of the steady state (one fewer in the first on the last stage,
        // whose backward there needs the forward just before it), then one in each round of the
        // cool-down's first part.
        const int rounds = m - 2 * p + stage + 1;
        EXPECT_EQ(pairs, 2 * rounds - (stage == p - 1 ? 1 : 0) + (p - stage - 1)) << "p=" << p << " m=" << m;
      }
    }
  }
  // No other schedule pairs (the interleaved one's forward and backward go one after the other).
  for (auto [kind, chunks] : {std::make_pair(ScheduleKind::kOneFOneB, 1), std::make_pair(ScheduleKind::kInterleaved, 2),
                              std::make_pair(ScheduleKind::kZbH1, 1), std::make_pair(ScheduleKind::kZbV, 2)})
    for (const std::vector<Action>& actions : make_schedule(kind, 2, chunks, 8).stages)
      for (const Action& a : actions) EXPECT_FALSE(a.paired) << schedule_name(kind);
}

TEST(ZeroBubbleSchedules, VSchedulesPlaceTheFirstAndLastChunkOnStageZero) {
  const Schedule s = make_schedule(ScheduleKind::kZbV, 4, 2, 8);
  EXPECT_EQ(s.virtual_stage(0, 0), 0);
  EXPECT_EQ(s.virtual_stage(0, 1), 7);
  EXPECT_EQ(s.virtual_stage(3, 0), 3);
  EXPECT_EQ(s.virtual_stage(3, 1), 4);
  for (int vs = 0; vs < 8; ++vs) EXPECT_EQ(s.virtual_stage(s.stage_of(vs), s.chunk_of(vs)), vs);
  // The turn of the V (virtual stages 3 and 4, both on stage 3) needs no transfer.
  for (const Action& a : s.stages[3])
    if (!a.is_compute()) EXPECT_NE(a.peer, 3);
}

TEST(ZeroBubbleSchedules, ImpossibleCombinationsNameTheKey) {
  expect_error([] { check_schedule(ScheduleKind::kZbV, 4, 1, 8); }, ExitCode::kUsage,
               {"parallel.virtual_stages = 1", "two chunks per stage in a V"});
  expect_error([] { check_schedule(ScheduleKind::kDualPipeV, 4, 2, 7); }, ExitCode::kUsage,
               {"train.grad_accum = 7", "at least 2 × parallel.pp = 8"});
  expect_error([] { check_schedule(ScheduleKind::kZbH1, 2, 2, 4); }, ExitCode::kUsage,
               {"parallel.virtual_stages = 2", "one chunk per stage"});
  EXPECT_EQ(schedule_kind_named("zb-h1"), ScheduleKind::kZbH1);
  EXPECT_EQ(schedule_kind_named("zbv"), ScheduleKind::kZbV);
  EXPECT_EQ(schedule_kind_named("dualpipev"), ScheduleKind::kDualPipeV);
}

// The channels (pipeline/channels.h) are those the schedule's transfers take, each between the
// two stages that send and receive on it, and none is left without a transfer.
TEST(ZeroBubbleSchedules, EveryTransferTakesAListedChannelBetweenItsTwoStages) {
  for (ScheduleKind kind : {ScheduleKind::kZbH1, ScheduleKind::kZbV, ScheduleKind::kDualPipeV}) {
    for (int pp : {2, 3, 4}) {
      const Schedule s = make_schedule(kind, pp, default_virtual_stages(kind), 2 * pp);
      const std::vector<Channel> channels = channels_of(s);
      std::vector<int> transfers_on(channels.size(), 0);
      for (int stage = 0; stage < pp; ++stage) {
        for (const Action& a : s.stages[stage]) {
          if (a.is_compute()) continue;
          const TransferId id = transfer_id(s, stage, a);
          const bool send = a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGrad;
          const auto channel = std::find_if(channels.begin(), channels.end(), [&](const Channel& c) {
            return c.activation == id.activation && c.from_virtual_stage == id.from_virtual_stage;
          });
          ASSERT_NE(channel, channels.end()) << schedule_name(kind) << " pp " << pp << ": no channel";
          EXPECT_EQ(send ? channel->sender : channel->receiver, stage);
          EXPECT_EQ(send ? channel->receiver : channel->sender, a.peer);
          ++transfers_on[channel - channels.begin()];
        }
      }
      for (size_t c = 0; c < channels.size(); ++c)
        EXPECT_EQ(transfers_on[c], 2 * s.microbatches)  // each micro-batch: its send and its receive
            << schedule_name(kind) << " pp " << pp << ": channel " << c;
      // A V has one turn within a stage, for activations and for gradients.
      const int virtual_stages = pp * s.virtual_stages;
      EXPECT_EQ(channels.size(), size_t(2 * (virtual_stages - 1) - (s.v_shape ? 2 : 0)));
    }
  }
}
