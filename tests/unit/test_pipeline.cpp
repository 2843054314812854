#include <gtest/gtest.h>

#include "dstrain/core/error.h"
#include "dstrain/pipeline/bubble.h"
#include "dstrain/pipeline/partition.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/simulator.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;

namespace {

SimulationResult run(ScheduleKind kind, int pp, int v, int m, double forward = 1, double backward = 1) {
  return simulate(make_schedule(kind, pp, v, m), {forward, backward, 0.0});
}

// Every micro-batch goes forward and backward through every chunk exactly once.
void expect_complete(const Schedule& s) {
  for (int stage = 0; stage < s.pp; ++stage) {
    int forwards = 0, backwards = 0;
    for (const Action& a : s.stages[stage]) {
      forwards += a.kind == ActionKind::kForward;
      backwards += a.kind == ActionKind::kBackward;
    }
    EXPECT_EQ(forwards, s.microbatches * s.virtual_stages);
    EXPECT_EQ(backwards, s.kind == ScheduleKind::kForwardOnly ? 0 : s.microbatches * s.virtual_stages);
  }
}

}  // namespace

// With equal costs, GPipe and 1F1B idle (p - 1) of every (m + p - 1) units on each stage.
TEST(PipelineSchedule, BubbleOfGPipeAnd1F1BIsTheTextbookFraction) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 4, 7, 16}) {
        SimulationResult r = run(kind, p, 1, m);
        ASSERT_FALSE(r.deadlock) << r.problem;
        EXPECT_NEAR(r.bubble_fraction, double(p - 1) / (m + p - 1), 1e-12)
            << schedule_name(kind) << " p=" << p << " m=" << m;
        EXPECT_DOUBLE_EQ(r.makespan, 2.0 * (m + p - 1));
      }
    }
  }
}

// Interleaving v chunks shrinks the bubble: by about v for many micro-batches (Narayanan et al.).
TEST(PipelineSchedule, InterleavingLowersTheBubble) {
  for (int p : {2, 4}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const double plain = run(ScheduleKind::kOneFOneB, p, 1, m).bubble_fraction;
      double previous = plain;
      for (int v : {2, 4}) {
        SimulationResult r = run(ScheduleKind::kInterleaved, p, v, m);
        ASSERT_FALSE(r.deadlock) << r.problem;
        EXPECT_LT(r.bubble_fraction, previous) << "p=" << p << " m=" << m << " v=" << v;
        // (p - 1) / v idle units against m units of work, per forward + backward.
        const double expected = (double(p - 1) / v) / (m + double(p - 1) / v);
        EXPECT_NEAR(r.bubble_fraction, expected, 1e-9) << "p=" << p << " m=" << m << " v=" << v;
        previous = r.bubble_fraction;
      }
    }
  }
}

TEST(PipelineSchedule, NoScheduleDeadlocksAndEveryMicrobatchRunsOnce) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 13; ++m) {
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kForwardOnly}) {
        Schedule s = make_schedule(kind, p, 1, m);
        expect_complete(s);
        for (double backward : {1.0, 2.0, 3.5}) {
          SimulationResult r = simulate(s, {1.0, backward, 0.25});
          EXPECT_FALSE(r.deadlock) << schedule_name(kind) << " p=" << p << " m=" << m << ": " << r.problem;
        }
      }
      for (int v = 2; v <= 4 && m % p == 0; ++v) {
        for (ScheduleKind kind : {ScheduleKind::kInterleaved, ScheduleKind::kForwardOnly}) {
          Schedule s = make_schedule(kind, p, v, m);
          expect_complete(s);
          SimulationResult r = simulate(s, {1.0, 2.0, 0.1});
          EXPECT_FALSE(r.deadlock) << schedule_name(kind) << " p=" << p << " m=" << m << " v=" << v << ": "
                                   << r.problem;
        }
      }
    }
  }
}

// The log's bubble from what each stage measures: its waits, and its span from the step's start
// (the same moment for every stage) to its last action. On the simulator's own timeline that is
// the simulator's bubble for every schedule, 1F1B included, whose last stage is done (p - 1)
// backward passes before the first: over each stage's own span, as the log once had it, 1F1B's
// bubble came out several points low.
TEST(PipelineBubble, MeasuredAsTheStagesSeeItIsTheSimulatorsBubble) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                            ScheduleKind::kZbH1, ScheduleKind::kZbV, ScheduleKind::kDualPipeV}) {
    for (int p : {2, 4}) {
      const int v = kind == ScheduleKind::kGPipe || kind == ScheduleKind::kOneFOneB || kind == ScheduleKind::kZbH1 ? 1 : 2;
      const Schedule s = make_schedule(kind, p, v, 8);
      SimulationCosts costs{1.0, 2.3, 0.9, 0.0, {}};
      for (int vs = 0; vs < p * v; ++vs) costs.per_virtual_stage.push_back({0.4 + 0.05 * vs, 0.8 + 0.1 * vs, 0.3});
      const SimulationResult r = simulate(s, costs);
      ASSERT_FALSE(r.deadlock) << r.problem;
      std::vector<StageWaits> stages;
      double mean_over_own_spans = 0;
      for (int stage = 0; stage < p; ++stage) {
        const double span = r.timeline[stage].back().end;
        stages.push_back({span - r.busy[stage], span});
        mean_over_own_spans += (span - r.busy[stage]) / span / p;
      }
      EXPECT_NEAR(pipeline_bubble(stages), r.bubble_fraction, 1e-12) << schedule_name(kind) << " p=" << p;
      if (kind == ScheduleKind::kOneFOneB) EXPECT_LT(mean_over_own_spans, r.bubble_fraction - 0.02);
    }
  }
}

TEST(PipelineBubble, NoStagesOrNoTimeIsNoBubble) {
  EXPECT_EQ(pipeline_bubble({}), 0.0);
  EXPECT_EQ(pipeline_bubble({{0.0, 0.0}, {0.0, 0.0}}), 0.0);
  EXPECT_NEAR(pipeline_bubble({{1.0, 4.0}, {0.0, 2.0}}), (1.0 + 2.0) / 8.0, 1e-15);
}

// 1F1B keeps at most p - s micro-batches alive on stage s (at most p); GPipe all m.
TEST(PipelineSchedule, PeakLiveActivations) {
  for (int p : {2, 4, 6}) {
    for (int m : {1, 3, 8, 16}) {
      SimulationResult one = run(ScheduleKind::kOneFOneB, p, 1, m, 1, 2);
      SimulationResult gpipe = run(ScheduleKind::kGPipe, p, 1, m, 1, 2);
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(one.peak_live[s], std::min(p - s, m)) << "p=" << p << " m=" << m << " s=" << s;
        EXPECT_LE(one.peak_live[s], p);
        EXPECT_EQ(gpipe.peak_live[s], m);
      }
    }
  }
}

// Transfers name both ends alike: the receiver's identity of a message equals the sender's.
TEST(PipelineSchedule, SendsAndReceivesPairUp) {
  Schedule s = make_schedule(ScheduleKind::kInterleaved, 2, 2, 4);
  std::vector<TransferId> sent, received;
  for (int stage = 0; stage < 2; ++stage)
    for (const Action& a : s.stages[stage]) {
      if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGrad)
        sent.push_back(transfer_id(s, stage, a));
      if (a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kRecvGrad)
        received.push_back(transfer_id(s, stage, a));
    }
  // 4 virtual stages: 3 boundaries, each crossed by 4 activations and 4 gradients.
  EXPECT_EQ(sent.size(), 24u);
  ASSERT_EQ(received.size(), sent.size());
  for (const TransferId& id : sent)
    EXPECT_EQ(std::count(received.begin(), received.end(), id), 1);
}

TEST(PipelineSchedule, ImpossibleCombinationsNameTheKey) {
  expect_error([] { check_schedule(ScheduleKind::kInterleaved, 4, 1, 8); }, ExitCode::kUsage,
               {"parallel.virtual_stages = 1", "at least 2"});
  expect_error([] { check_schedule(ScheduleKind::kInterleaved, 4, 2, 6); }, ExitCode::kUsage,
               {"train.grad_accum = 6", "multiples of parallel.pp = 4"});
  expect_error([] { check_schedule(ScheduleKind::kInterleaved, 4, 2, 2); }, ExitCode::kUsage, {"train.grad_accum = 2"});
  expect_error([] { check_schedule(ScheduleKind::kOneFOneB, 2, 2, 4); }, ExitCode::kUsage,
               {"parallel.virtual_stages = 2", "interleaved"});
  expect_error([] { schedule_kind_named("zero-bubble"); }, ExitCode::kUsage, {"parallel.schedule = zero-bubble"});
  check_schedule(ScheduleKind::kOneFOneB, 8, 1, 1);  // fewer micro-batches than stages: slow, not wrong
}

TEST(PipelinePartition, BalancesLayersWithTheHeadCounted) {
  ModelConfig m;
  m.vocab_size = 102400;
  m.hidden_size = 2048;
  m.intermediate_size = 5504;
  m.num_layers = 16;
  m.num_heads = 16;
  m.num_kv_heads = 16;
  std::vector<LayerSlice> slices = partition_layers(m, 2048, 4, {});
  ASSERT_EQ(slices.size(), 4u);
  int64_t next = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    EXPECT_EQ(slices[i].first, next);
    EXPECT_GT(slices[i].last, slices[i].first);
    EXPECT_EQ(slices[i].has_embedding, i == 0);
    EXPECT_EQ(slices[i].has_head, i == 3);
    next = slices[i].last;
  }
  EXPECT_EQ(next, 16);
  // The head (6 × 102400 × 2048 FLOPs per token, about 1.7 layers here) leaves the last stage
  // fewer layers than the others.
  EXPECT_LT(slices[3].last - slices[3].first, slices[0].last - slices[0].first);

  std::vector<LayerSlice> given = partition_layers(m, 2048, 2, {10, 6});
  EXPECT_EQ(given[0].last, 10);
  EXPECT_EQ(given[1].first, 10);
  expect_error([&] { partition_layers(m, 2048, 2, {10, 5}); }, ExitCode::kUsage,
               {"parallel.stage_layers = 10,5", "adding up to model.num_layers = 16"});
  expect_error([&] { partition_layers(m, 2048, 17, {}); }, ExitCode::kUsage, {"more pipeline stages"});
}

// The message names what the number is: 2 stages × 2 chunks are 4 virtual stages, not pp = 4.
TEST(PipelinePartition, TooManyStagesNamesBothSettings) {
  ModelConfig m;
  m.num_layers = 3;
  expect_error([&] { partition_layers(m, 64, 4, {}); }, ExitCode::kUsage,
               {"parallel.pp × parallel.virtual_stages = 4", "model.num_layers = 3"});
}
