// Expert parallelism (parallel.ep) on real mpirun ranks, against the same training on one rank:
// input/tiny-v3.ini's 8 routed experts in 4 groups (2 chosen per token from 2 groups), a shared
// expert, auxiliary-loss-free balancing and a multi-token prediction module with an MoE layer.
#include <gtest/gtest.h>

#include <unistd.h>

#include <map>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/ckpt/training_checkpoint.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

constexpr int kSteps = 10;

RunOutput train_v3(int ranks, const std::string& run_dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--train.device", "cpu", "--train.steps", std::to_string(kSteps), "--ckpt.interval", "5"});
  return train_tiny_v3(ranks, run_dir, extra);
}

// The run on one rank, once per test process.
const std::string& single_rank() {
  static std::string dir = [] {
    std::string d = scratch_dir("ep-one-rank-" + std::to_string(getpid()));
    RunOutput run = train_v3(1, d, {});
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return d;
  }();
  return dir;
}

}  // namespace

// ep 2, ep 4 over dp 4, ep 2 with ZeRO-1, and dp 4 × ep 2 × pp 2 on 8 ranks train the model one
// rank trains: every step's losses and the final parameters (all experts, gathered from their
// holders) by name. The log reports the exchange: each token reaches at most topk_group ranks,
// since the 4 expert groups lie whole on the ranks.
TEST(ExpertParallel, EveryLayoutMatchesOneRank) {
  const std::vector<std::pair<int, std::vector<std::string>>> layouts = {
      {2, {"--parallel.ep", "2"}},
      {4, {"--parallel.ep", "4"}},
      {4, {"--parallel.ep", "2", "--optim.zero", "1"}},
      {8, {"--parallel.ep", "2", "--parallel.pp", "2"}}};
  for (const auto& [ranks, options] : layouts) {
    const std::string dir = scratch_dir("ep-layout-" + std::to_string(ranks) + "-" + options[1] +
                                        (options.size() > 2 ? options[2].substr(11) : ""));
    SCOPED_TRACE(dir);
    RunOutput run = train_v3(ranks, dir, options);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    expect_same_losses(dir, single_rank(), kSteps, {"loss", "mtp_loss", "balance_loss"});
    expect_same_parameters(dir, single_rank());
    EXPECT_NE(run.output.find("EP rank load max/mean"), std::string::npos);
    EXPECT_NE(run.output.find("expert exchange"), std::string::npos);
    const nlohmann::json last = train_records(dir).back();
    ASSERT_TRUE(last.contains("ep_ranks_per_token")) << last.dump();
    for (const auto& [layer, ranks_reached] : last["ep_ranks_per_token"].items()) {
      EXPECT_GE(ranks_reached.get<double>(), 1.0) << layer;
      EXPECT_LE(ranks_reached.get<double>(), 2.0) << layer;  // model.topk_group
    }
    EXPECT_GE(last["ep_load_max_over_mean"]["1"].get<double>(), 1.0);
    EXPECT_GT(last["expert_exchange_share"].get<double>(), 0.0);
  }
}

// A checkpoint of ep 4 holds every expert under its own name, whoever held it: resumed as ep 4 the
// run ends bitwise where it ended without stopping; as dp 2 × ep 2 × pp 2, or on one rank, it goes
// on with the same losses.
TEST(ExpertParallel, CheckpointsResumeOnAnyLayout) {
  const std::string ep4 = scratch_dir("ep4-uninterrupted");
  RunOutput run = train_v3(4, ep4, {"--parallel.ep", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string middle = checkpoint_file(ep4, 5);
  {
    dstrain::CheckpointReader reader(middle);
    for (const char* name : {"model/model.layers.1.mlp.experts.0.up_proj.weight",
                             "model/model.layers.3.mlp.experts.7.down_proj.weight",
                             "optim/model.layers.2.mlp.experts.5.gate_proj.weight/exp_avg"})
      EXPECT_NE(reader.find(name), nullptr) << name;
  }
  const RunOutput inspect = run_dstrain(0, {"ckpt", "inspect", middle});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("written by 4 ranks: dp 4 x pp 1 (experts over ep 4)"), std::string::npos)
      << inspect.output;
  // Evaluated with its experts split again, the final model gives one rank's loss.
  double eval_loss[2] = {0, 0};
  for (int ep : {1, 4}) {
    const std::string json = scratch_dir("ep-eval-" + std::to_string(ep)) + "/eval.json";
    RunOutput eval = run_dstrain(ep == 1 ? 0 : ep, {"eval", "--ckpt", ep4 + "/final_model.h5", "--data", test_corpus().valid,
                                                    "--json", json, "--parallel.ep", std::to_string(ep)});
    ASSERT_EQ(eval.exit_code, 0) << eval.output;
    eval_loss[ep == 4] = read_json(json)["loss"].get<double>();
  }
  EXPECT_NEAR(eval_loss[1], eval_loss[0], 1e-6);
  EXPECT_GT(eval_loss[0], 0.0);

  const std::string again = scratch_dir("ep4-resumed-ep4");
  run = train_v3(4, again, {"--parallel.ep", "4", "--ckpt.resume", middle});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(read_json(again + "/summary.json")["param_digest"], read_json(ep4 + "/summary.json")["param_digest"]);
  EXPECT_EQ(read_json(again + "/summary.json")["layout"]["ep"], 4);

  const std::vector<std::pair<int, std::vector<std::string>>> others = {
      {4, {"--parallel.ep", "2", "--parallel.pp", "2"}}, {1, {}}};
  for (const auto& [ranks, options] : others) {
    const std::string dir = scratch_dir("ep4-resumed-on-" + std::to_string(ranks));
    std::vector<std::string> args = options;
    args.insert(args.end(), {"--ckpt.resume", middle});
    run = train_v3(ranks, dir, args);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    expect_same_losses(dir, ep4, kSteps - 5, {"loss", "mtp_loss", "balance_loss"});
    expect_same_parameters(dir, ep4);
  }
}

// Biases that send every token to experts 0 and 1: expert-parallel rank 0 of 4 receives every
// row, ranks 1-3 none, in every exchange forward and backward. Nothing hangs, nothing is dropped,
// and the run still equals one rank's.
TEST(ExpertParallel, AllTokensOnOneRankStillMatchOneRank) {
  dstrain::CheckpointReader start(single_rank() + "/final_model.h5");
  std::map<std::string, torch::Tensor> weights;
  std::vector<std::string> names;
  for (auto& [name, tensor] : dstrain::read_parameter_file(start.path())) {
    if (name.find("e_score_correction_bias") != std::string::npos) {
      tensor.zero_();
      tensor.narrow(0, 0, 2).fill_(10.0);
    }
    weights[name] = tensor;
    names.push_back(name);
  }
  const std::string skewed = scratch_dir("ep-skewed") + "/skewed.h5";
  dstrain::write_model_checkpoint(skewed, names, [&](const std::string& name) { return weights.at(name); },
                                  start.state());
  const std::string one = scratch_dir("ep-skewed-one"), ep4 = scratch_dir("ep-skewed-ep4");
  RunOutput run = train_v3(1, one, {"--ckpt.load_weights", skewed, "--train.steps", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  run = train_v3(4, ep4, {"--ckpt.load_weights", skewed, "--train.steps", "4", "--parallel.ep", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expect_same_losses(ep4, one, 4, {"loss", "mtp_loss", "balance_loss"});
  expect_same_parameters(ep4, one);
  for (const nlohmann::json& record : train_records(ep4))
    for (const char* layer : {"1", "2", "3"}) {
      EXPECT_DOUBLE_EQ(record["ep_load_max_over_mean"][layer].get<double>(), 4.0) << "layer " << layer;
      EXPECT_DOUBLE_EQ(record["ep_ranks_per_token"][layer].get<double>(), 1.0) << "layer " << layer;
    }
}

// Layouts that cannot split the experts: exit code 2 and a message naming both numbers.
TEST(ExpertParallel, RefusesLayoutsThatDoNotDivide) {
  struct Case {
    int ranks;
    std::vector<std::string> options;
    std::string message;
  };
  const std::vector<Case> cases = {
      {2, {"--parallel.ep", "4"}, "must divide parallel.tp × cp × dp = 2"},
      {3, {"--parallel.ep", "3"}, "must divide model.n_routed_experts = 8"},
      {2,
       {"--parallel.ep", "2", "--model.n_routed_experts", "0", "--model.n_shared_experts", "0"},
       "the model has no routed experts"}};
  for (const Case& c : cases) {
    RunOutput run = train_v3(c.ranks, scratch_dir("ep-refused"), c.options);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find("parallel.ep"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(c.message), std::string::npos) << run.output;
  }
}

// Full recomputation reruns each layer's token exchange in the backward pass, on every rank of
// the expert-parallel group alike; selective recomputation reruns the experts' activations on the
// ranks that received the tokens: the same bits as keeping the activations.
TEST(ExpertParallel, RecomputationChangesNoBit) {
  const std::string kept = scratch_dir("ep-recompute-none");
  RunOutput none = train_v3(4, kept, {"--parallel.ep", "2", "--parallel.pp", "2", "--train.recompute", "none"});
  ASSERT_EQ(none.exit_code, 0) << none.output;
  for (const char* mode : {"selective", "full"}) {
    const std::string rerun = scratch_dir(std::string("ep-recompute-") + mode);
    RunOutput run = train_v3(4, rerun, {"--parallel.ep", "2", "--parallel.pp", "2", "--train.recompute", mode});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(read_json(rerun + "/summary.json")["param_digest"], read_json(kept + "/summary.json")["param_digest"])
        << mode;
    const auto a = train_records(kept), b = train_records(rerun);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << mode << ", step " << i + 1;
  }
}
