// The zero-bubble schedules (zb-h1, zbv, dualpipev) end to end on a DeepSeek-V3-shaped model:
// every layout trains what one rank trains (losses, MTP and balance losses, final parameters by
// name), and a checkpoint of one schedule resumes under another. (The dense model's layouts are
// with the other schedules' in test_pipeline.cpp.) And `dstrain pipeline simulate`, which draws them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "dstrain/ckpt/parameter_file.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// 8 layers, so that pp 4 × 2 chunks has one per virtual stage; 8 steps; 8 micro-batches per step
// on one rank, 8 / dp on each rank of a layout.
RunOutput train_v3(int dp, int pp, const std::string& schedule, const std::string& dir,
                   std::vector<std::string> extra = {}) {
  const bool v = schedule == "zbv" || schedule == "dualpipev";
  std::vector<std::string> args = {"--train.device", "cpu", "--model.num_layers", "8", "--train.steps", "8",
                                   "--parallel.pp", std::to_string(pp), "--parallel.schedule", schedule,
                                   "--parallel.virtual_stages", v ? "2" : "1", "--ckpt.interval", "4"};
  args.insert(args.end(), extra.begin(), extra.end());
  return train_tiny_v3(dp * pp, dir, args);
}

const std::string& single_rank() {
  static std::string dir = [] {
    std::string d = scratch_dir("zero-bubble-one-rank-" + std::to_string(getpid()));
    RunOutput run = train_v3(1, 1, "1f1b", d);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return d;
  }();
  return dir;
}

void expect_same_training(const std::string& dir, const std::string& reference, size_t first_step = 1) {
  auto mine = train_records(dir), theirs = train_records(reference);
  ASSERT_EQ(theirs.size(), 8u);
  ASSERT_EQ(mine.size(), 9 - first_step);
  for (size_t i = 0; i < mine.size(); ++i) {
    const nlohmann::json& a = mine[i];
    const nlohmann::json& b = theirs[i + first_step - 1];
    ASSERT_EQ(a["step"], b["step"]);
    for (const char* key : {"loss", "mtp_loss", "balance_loss"}) {
      ASSERT_TRUE(a.contains(key)) << key;
      EXPECT_NEAR(a[key].get<double>(), b[key].get<double>(), 1e-5) << key << " at step " << a["step"];
    }
  }
  dstrain::NamedTensors x = dstrain::read_parameter_file(dir + "/final_model.h5");
  dstrain::NamedTensors y = dstrain::read_parameter_file(reference + "/final_model.h5");
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].first, y[i].first);
    EXPECT_LT((x[i].second - y[i].second).abs().max().item<float>(), 1e-5) << x[i].first;
  }
}

struct Layout {
  int dp, pp;
  std::string schedule;
};

std::string name(const Layout& l) {
  std::string n = "dp" + std::to_string(l.dp) + "_pp" + std::to_string(l.pp) + "_" + l.schedule;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

void PrintTo(const Layout& l, std::ostream* out) { *out << name(l); }

class ZeroBubbleLayouts : public ::testing::TestWithParam<Layout> {};

}  // namespace

TEST_P(ZeroBubbleLayouts, DeepSeekV3EqualsOneRank) {
  const Layout layout = GetParam();
  const std::string dir = scratch_dir("zero-bubble-" + name(layout));
  RunOutput run = train_v3(layout.dp, layout.pp, layout.schedule, dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("schedule " + layout.schedule), std::string::npos) << run.output;
  expect_same_training(dir, single_rank());
}

INSTANTIATE_TEST_SUITE_P(EveryZeroBubbleSchedule, ZeroBubbleLayouts,
                         ::testing::Values(Layout{1, 2, "zb-h1"}, Layout{1, 2, "zbv"}, Layout{1, 2, "dualpipev"},
                                           Layout{2, 2, "zb-h1"}, Layout{2, 2, "zbv"}, Layout{2, 2, "dualpipev"},
                                           Layout{1, 4, "zb-h1"}, Layout{1, 4, "zbv"}, Layout{1, 4, "dualpipev"}),
                         [](const ::testing::TestParamInfo<Layout>& info) { return name(info.param); });

// Checkpoints are layout-free: one written under zbv resumes under dualpipev on other ranks, and
// one written under dualpipev under zb-h1 and under 1f1b on 4 stages, each going on as the
// one-rank run does.
TEST(ZeroBubble, ACheckpointOfOneScheduleResumesUnderAnother) {
  const std::string zbv = scratch_dir("zero-bubble-zbv-source");
  RunOutput first = train_v3(1, 2, "zbv", zbv);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string dualpipev = scratch_dir("zero-bubble-dualpipev-resumed");
  RunOutput second = train_v3(2, 2, "dualpipev", dualpipev,
                              {"--ckpt.resume", zbv + "/checkpoints/step_00000004.h5", "--ckpt.interval", "2"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  expect_same_training(dualpipev, single_rank(), 5);
  for (const std::string& schedule : {"zb-h1", "1f1b"}) {
    const std::string dir = scratch_dir("zero-bubble-" + schedule + "-resumed");
    RunOutput third = train_v3(1, 4, schedule, dir, {"--ckpt.resume", dualpipev + "/checkpoints/step_00000006.h5"});
    ASSERT_EQ(third.exit_code, 0) << third.output;
    expect_same_training(dir, single_rank(), 7);
  }
}

// What else shapes the backward pass stays right under a split one: recomputation reruns its
// projections inside B, the overlapped buckets start when their last W is in, ZeRO-1 shards them,
// and expert parallelism exchanges tokens in both passes.
TEST(ZeroBubble, RecomputationZeroAndExpertParallelismStayRight) {
  const std::string dir = scratch_dir("zero-bubble-everything");
  RunOutput run = train_v3(2, 2, "dualpipev", dir,
                           {"--train.recompute", "selective", "--optim.zero", "1", "--comm.overlap", "true",
                            "--comm.bucket_mb", "0.05", "--parallel.ep", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expect_same_training(dir, single_rank());
}

// DualPipeV's pairs side by side: each pair's forward on a second thread, its expert all-to-all on
// a communicator of its own, while the main thread runs the paired backward pass (whose
// recomputed forward exchanges again). The same bits as one after the other, and the log says how
// much of the exchange the other lane hid (a share of each step's; how much is a benchmark's
// figure, which a loaded machine changes).
TEST(ZeroBubble, DualPipeVPairsSideBySideTrainTheSameBitsAndHideExchanges) {
  const std::vector<std::string> expert_parallel = {"--parallel.ep", "2", "--train.recompute", "full",
                                                    "--log.interval", "1"};
  auto run_pairs = [&](const std::string& name, const std::string& side_by_side) {
    const std::string dir = scratch_dir("zero-bubble-pairs-" + name);
    std::vector<std::string> args = expert_parallel;
    args.insert(args.end(), {"--parallel.dualpipe_overlap", side_by_side});
    RunOutput run = train_v3(2, 2, "dualpipev", dir, args);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return std::make_pair(dir, run.output);
  };
  const auto [apart, apart_output] = run_pairs("apart", "false");
  const auto [beside, beside_output] = run_pairs("beside", "true");
  const std::vector<nlohmann::json> a = train_records(apart), b = train_records(beside);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (const char* key : {"loss", "mtp_loss", "balance_loss", "grad_norm"})
      EXPECT_EQ(b[i][key].get<double>(), a[i][key].get<double>()) << key << " at step " << a[i]["step"];
    EXPECT_FALSE(a[i].contains("expert_exchange_hidden"));
    ASSERT_TRUE(b[i].contains("expert_exchange_hidden")) << b[i].dump();
    const double hidden = b[i]["expert_exchange_hidden"].get<double>();
    EXPECT_GE(hidden, 0.0);
    EXPECT_LE(hidden, 1.0);
  }
  EXPECT_NE(beside_output.find("% hidden)"), std::string::npos) << beside_output;
  const dstrain::NamedTensors x = dstrain::read_parameter_file(beside + "/final_model.h5");
  const dstrain::NamedTensors y = dstrain::read_parameter_file(apart + "/final_model.h5");
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].first, y[i].first);
    EXPECT_TRUE(x[i].second.equal(y[i].second)) << x[i].first;
  }
}

// `dstrain pipeline simulate` draws a schedule and gives its bubble beside the paper's: ZB-H1 on 2
// stages, 4 micro-batches of F = 1, B = 2 of which W = 1, is busy 4 × (F + B) = 12 per stage and
// idle (p − 1)(F + B − W) = 1 (Qi et al.), so the bubble is 1 / 13. Bad values name this
// command's own flags, not the training keys the schedule's checks speak of.
TEST(ZeroBubble, SimulateGivesThePublishedBubbleAndNamesItsOwnFlags) {
  RunOutput drawn = run_dstrain(0, {"pipeline", "simulate", "--pp", "2", "--microbatches", "4", "--schedule", "zb-h1"});
  EXPECT_EQ(drawn.exit_code, 0) << drawn.output;
  EXPECT_NE(drawn.output.find("step time 13.00; bubble fraction 0.0769"), std::string::npos) << drawn.output;
  EXPECT_NE(drawn.output.find("(p - 1)(F + B - W) = 1.00 idle"), std::string::npos) << drawn.output;
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--forward-cost", "-1"}, "--forward-cost = -1: expected more than 0"},
      {{"--backward-cost", "0"}, "--backward-cost = 0: expected more than 0"},
      {{"--transfer-cost", "-2"}, "--transfer-cost = -2: expected at least 0"},
      {{"--schedule", "dualpipev", "--pp", "4"}, "--microbatches = 4: the dualpipev schedule needs at least 2 × --pp = 8 micro-batches\n"},
      {{"--schedule", "zbv", "--virtual-stages", "3"}, "--virtual-stages = 3: the zbv schedule runs two chunks per stage"},
  };
  for (const auto& [extra, message] : bad) {
    std::vector<std::string> args = {"pipeline", "simulate", "--microbatches", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    if (std::find(extra.begin(), extra.end(), "--pp") == extra.end()) args.insert(args.end(), {"--pp", "2"});
    RunOutput run = run_dstrain(0, args);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find("error: " + message), std::string::npos) << run.output;
  }
}
