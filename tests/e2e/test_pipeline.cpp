// Pipeline parallelism end to end: every layout and schedule trains the same model as one rank,
// step by step, and ends with the same parameters.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>

#include "dstrain/ckpt/parameter_file.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// 8 layers (interleaved over 4 stages needs 8 virtual stages), 8 sequences per step, one per
// micro-batch: 8 micro-batches on one rank, 8 / dp on each rank of a layout.
const std::vector<std::string> kModel = {"--train.device", "cpu", "--model.num_layers", "8", "--train.micro_batch",
                                         "1", "--train.global_batch", "8", "--ckpt.save_final", "true"};

bool two_chunks(const std::string& schedule) {
  return schedule == "interleaved" || schedule == "zbv" || schedule == "dualpipev";
}

RunOutput train(int dp, int pp, const std::string& schedule, const std::string& run_dir) {
  std::vector<std::string> args = kModel;
  args.insert(args.end(), {"--parallel.pp", std::to_string(pp), "--parallel.schedule", schedule,
                           "--parallel.virtual_stages", two_chunks(schedule) ? "2" : "1"});
  return train_tiny(dp * pp, run_dir, args);
}

// Once per test process (ctest runs each test in its own, several at a time).
const std::string& single_rank() {
  static std::string dir = [] {
    std::string d = scratch_dir("pipeline-reference-" + std::to_string(getpid()));
    RunOutput run = train(1, 1, "1f1b", d);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return d;
  }();
  return dir;
}

struct Layout {
  int dp, pp;
  std::string schedule;
};

std::string name(const Layout& l) {
  return "dp" + std::to_string(l.dp) + "-pp" + std::to_string(l.pp) + "-" + l.schedule;
}

void PrintTo(const Layout& l, std::ostream* out) { *out << name(l); }

class PipelineLayouts : public ::testing::TestWithParam<Layout> {};

}  // namespace

TEST_P(PipelineLayouts, LossesAndFinalParametersEqualOneRank) {
  const Layout layout = GetParam();
  std::string dir = scratch_dir("pipeline-" + name(layout));
  RunOutput run = train(layout.dp, layout.pp, layout.schedule, dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("pipeline: " + std::to_string(layout.pp) + " stages"), std::string::npos) << run.output;

  auto mine = train_records(dir), reference = train_records(single_rank());
  ASSERT_EQ(mine.size(), 20u);
  ASSERT_EQ(reference.size(), mine.size());
  const bool split = layout.schedule == "zb-h1" || layout.schedule == "zbv" || layout.schedule == "dualpipev";
  const size_t virtual_stages = layout.pp * (two_chunks(layout.schedule) ? 2 : 1);
  double weight_ms = 0, backward_ms = 0;  // after the first step, which allocates
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_NEAR(mine[i]["loss"].get<double>(), reference[i]["loss"].get<double>(), 1e-5) << "step " << i + 1;
    // The bubble, as measured, is in the record of every step.
    ASSERT_TRUE(mine[i].contains("pipeline_idle"));
    EXPECT_GE(mine[i]["pipeline_idle"].get<double>(), 0.0);
    EXPECT_LT(mine[i]["pipeline_idle"].get<double>(), 1.0);
    // Beside it the simulator's, from the times each kind of action took on each virtual stage;
    // the weight-gradient actions of the split backward passes among them.
    ASSERT_TRUE(mine[i].contains("pipeline_idle_predicted"));
    EXPECT_GE(mine[i]["pipeline_idle_predicted"].get<double>(), 0.0);
    EXPECT_LT(mine[i]["pipeline_idle_predicted"].get<double>(), 1.0);
    const nlohmann::json& r = mine[i];
    ASSERT_EQ(r["pipeline_forward_ms"].size(), virtual_stages);
    ASSERT_EQ(r["pipeline_backward_ms"].size(), virtual_stages);
    ASSERT_EQ(r.contains("pipeline_weight_ms"), split);
    for (size_t vs = 0; vs < virtual_stages; ++vs) {
      EXPECT_GT(r["pipeline_forward_ms"][vs].get<double>(), 0.0);
      EXPECT_GT(r["pipeline_backward_ms"][vs].get<double>(), 0.0);
      if (!split) continue;
      EXPECT_GT(r["pipeline_weight_ms"][vs].get<double>(), 0.0);
      if (i == 0) continue;
      weight_ms += r["pipeline_weight_ms"][vs].get<double>();
      backward_ms += r["pipeline_backward_ms"][vs].get<double>();
    }
  }
  // The weight gradients' products really wait for W: W actions with nothing to compute would take
  // microseconds, against milliseconds for the products (about half of a backward pass).
  if (split) EXPECT_GT(weight_ms, 0.1 * backward_ms);
  auto eval_mine = eval_records(dir), eval_reference = eval_records(single_rank());
  ASSERT_EQ(eval_mine.size(), eval_reference.size());
  for (size_t i = 0; i < eval_mine.size(); ++i)
    EXPECT_NEAR(eval_mine[i]["eval_loss"].get<double>(), eval_reference[i]["eval_loss"].get<double>(), 1e-5);

  // Every parameter, by name, gathered from the stages that held it.
  dstrain::NamedTensors a = dstrain::read_parameter_file(dir + "/final_model.h5");
  dstrain::NamedTensors b = dstrain::read_parameter_file(single_rank() + "/final_model.h5");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 2u + 8 * 9 + 1);  // embedding, head, 8 × (4 attention + 3 MLP + 2 norms), final norm
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_LT((a[i].second - b[i].second).abs().max().item<float>(), 1e-5) << a[i].first;
  }
  EXPECT_FALSE(a[0].second.equal(torch::zeros_like(a[0].second)));
}

INSTANTIATE_TEST_SUITE_P(EveryScheduleAndLayout, PipelineLayouts,
                         ::testing::Values(Layout{1, 2, "gpipe"}, Layout{1, 2, "1f1b"}, Layout{1, 2, "interleaved"},
                                           Layout{2, 2, "gpipe"}, Layout{2, 2, "1f1b"}, Layout{2, 2, "interleaved"},
                                           Layout{1, 4, "gpipe"}, Layout{1, 4, "1f1b"}, Layout{1, 4, "interleaved"},
                                           Layout{1, 2, "zb-h1"}, Layout{1, 2, "zbv"}, Layout{1, 2, "dualpipev"},
                                           Layout{2, 2, "zb-h1"}, Layout{2, 2, "zbv"}, Layout{2, 2, "dualpipev"},
                                           Layout{1, 4, "zb-h1"}, Layout{1, 4, "zbv"}, Layout{1, 4, "dualpipev"}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           std::string n = name(info.param);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// Two multi-token prediction modules on the last of 8 interleaved virtual stages: the token
// embeddings travel with the activations through the 6 between, and the run is the one-rank run.
TEST(Pipeline, MultiTokenPredictionAcrossInterleavedStagesEqualsOneRank) {
  const std::vector<std::string> mtp = {"--model.num_nextn_predict_layers", "2", "--train.steps", "8"};
  auto run_with = [&](int pp, const std::string& dir) {
    std::vector<std::string> args = kModel;
    args.insert(args.end(), mtp.begin(), mtp.end());
    args.insert(args.end(), {"--parallel.pp", std::to_string(pp), "--parallel.schedule", pp > 1 ? "interleaved" : "1f1b",
                             "--parallel.virtual_stages", pp > 1 ? "2" : "1"});
    return train_tiny(pp, dir, args);
  };
  const std::string one = scratch_dir("pipeline-mtp-one"), four = scratch_dir("pipeline-mtp-pp4");
  RunOutput reference_run = run_with(1, one);
  ASSERT_EQ(reference_run.exit_code, 0) << reference_run.output;
  RunOutput run = run_with(4, four);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto mine = train_records(four), reference = train_records(one);
  ASSERT_EQ(mine.size(), 8u);
  ASSERT_EQ(reference.size(), mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_NEAR(mine[i]["loss"].get<double>(), reference[i]["loss"].get<double>(), 1e-5) << "step " << i + 1;
    ASSERT_TRUE(mine[i].contains("mtp_loss"));
    EXPECT_NEAR(mine[i]["mtp_loss"].get<double>(), reference[i]["mtp_loss"].get<double>(), 1e-5) << "step " << i + 1;
  }
  dstrain::NamedTensors a = dstrain::read_parameter_file(four + "/final_model.h5");
  dstrain::NamedTensors b = dstrain::read_parameter_file(one + "/final_model.h5");
  // The main model, and two modules of a decoder layer (9) and 4 more each (enorm, hnorm,
  // eh_proj, shared_head.norm).
  ASSERT_EQ(a.size(), 2u + 8 * 9 + 1 + 2 * (9 + 4));
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_LT((a[i].second - b[i].second).abs().max().item<float>(), 1e-5) << a[i].first;
  }
}

TEST(Pipeline, ImpossibleLayoutsAreConfigurationErrors) {
  std::string dir = scratch_dir("pipeline-errors");
  struct Case {
    int ranks;
    std::vector<std::string> args;
    std::string expected;
  };
  std::vector<Case> cases = {
      {2, {"--parallel.pp", "2", "--model.num_layers", "1"}, "more pipeline stages"},
      {2, {"--parallel.pp", "2", "--parallel.virtual_stages", "2"}, "parallel.virtual_stages = 2"},
      {2,
       {"--parallel.pp", "2", "--parallel.schedule", "interleaved", "--parallel.virtual_stages", "2",
        "--train.grad_accum", "3"},
       "train.grad_accum = 3"},
      {2, {"--parallel.pp", "2", "--parallel.stage_layers", "2,1"}, "parallel.stage_layers = 2,1"},
      {2, {"--parallel.pp", "2", "--parallel.stage_layers", "1;1"}, "parallel.stage_layers = 1;1"},
      {2, {"--parallel.schedule", "zero-bubble"}, "parallel.schedule = zero-bubble"},
      {2,
       {"--parallel.pp", "2", "--parallel.schedule", "zbv", "--parallel.virtual_stages", "1"},
       "parallel.virtual_stages = 1"},
      // (its default, 0, gives zbv its 2 chunks: 4 virtual stages, more than tiny.ini's 2 layers)
      {2, {"--parallel.pp", "2", "--parallel.schedule", "zbv"}, "parallel.pp × parallel.virtual_stages = 4"},
      {2,
       {"--parallel.pp", "2", "--parallel.schedule", "dualpipev", "--parallel.virtual_stages", "2",
        "--train.grad_accum", "3"},
       "train.grad_accum = 3"},
      {3, {"--parallel.pp", "2"}, "parallel.pp = 2: tp × cp × pp = 2 must divide the number of ranks (3)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--train.device", "cpu"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    RunOutput run = train_tiny(c.ranks, dir + "/run", args);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(c.expected), std::string::npos) << "expected \"" << c.expected << "\" in:\n" << run.output;
    EXPECT_EQ(run.output.find("] error:"), run.output.rfind("] error:")) << run.output;
  }
}
