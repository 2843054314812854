// parallel.order on real mpirun ranks: dp 4 × ep 2 × pp 2 on 8 ranks (input/tiny-v3.ini: MLA,
// routed experts, multi-token prediction; zb-h1 and selective recomputation) trains under every
// order the grid takes what it trains under the default order, step by step and parameter by
// parameter; the orders it refuses end before training with exit code 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/core/error.h"
#include "dstrain/parallel/parallel_grid.h"
#include "e2e_util.h"

using namespace dstrain::e2e;
using dstrain::Group;
using dstrain::ParallelConfig;
using dstrain::ParallelGrid;

namespace {

ParallelConfig layout(const std::string& order) {
  ParallelConfig c;
  c.dp = 4;
  c.pp = 2;
  c.ep = 2;
  c.order = order;
  return c;
}

RunOutput train(const std::string& order, const std::string& dir) {
  return train_tiny_v3(8, dir,
                       {"--train.device", "cpu", "--train.steps", "8", "--parallel.pp", "2", "--parallel.ep", "2",
                        "--parallel.schedule", "zb-h1", "--train.recompute", "selective", "--parallel.order", order});
}

// The orders of the five names, one for each different grid (orders that differ only where
// dimensions of size 1 stand give the same groups), and those the grid refuses.
struct Orders {
  std::vector<std::string> distinct, refused;
};
Orders every_order() {
  std::vector<std::string> names = {"cp", "dp", "ep", "pp", "tp"};
  Orders orders;
  std::vector<std::vector<std::vector<std::vector<int>>>> seen;
  do {
    std::string order;
    for (const std::string& name : names) order += (order.empty() ? "" : "-") + name;
    try {
      const ParallelGrid grid(layout(order));
      std::vector<std::vector<std::vector<int>>> groups;
      for (Group kind : dstrain::every_group()) groups.push_back(grid.all(kind));
      if (std::find(seen.begin(), seen.end(), groups) != seen.end()) continue;
      seen.push_back(groups);
      orders.distinct.push_back(order);
    } catch (const dstrain::Error&) {
      orders.refused.push_back(order);
    }
  } while (std::next_permutation(names.begin(), names.end()));
  return orders;
}

}  // namespace

TEST(ParallelOrder, EveryOrderTheGridTakesTrainsWhatTheDefaultTrains) {
  const Orders orders = every_order();
  // With tp = cp = 1 only the order of ep, dp and pp counts: pp first or last, four grids.
  ASSERT_EQ(orders.distinct.size(), 4u);
  ASSERT_EQ(orders.refused.size(), 40u);
  const std::string reference = scratch_dir("order-default");
  const RunOutput defaults = train("tp-cp-ep-dp-pp", reference);
  ASSERT_EQ(defaults.exit_code, 0) << defaults.output;
  // The start-up log: each kind of group once, with its size.
  EXPECT_NE(defaults.output.find("groups (parallel.order tp-cp-ep-dp-pp): tp 1 cp 1 dp 4 pp 2 dp-cp 4 ep 2 edp 2"),
            std::string::npos)
      << defaults.output;
  const std::vector<nlohmann::json> expected = train_records(reference);
  ASSERT_EQ(expected.size(), 8u);
  const dstrain::NamedTensors expected_parameters = dstrain::read_parameter_file(reference + "/final_model.h5");
  for (const std::string& order : orders.distinct) {
    const std::string dir = scratch_dir("order-" + order);
    const RunOutput run = train(order, dir);
    ASSERT_EQ(run.exit_code, 0) << order << ":\n" << run.output;
    const std::vector<nlohmann::json> records = train_records(dir);
    ASSERT_EQ(records.size(), expected.size()) << order;
    for (size_t i = 0; i < records.size(); ++i)
      for (const char* key : {"loss", "mtp_loss", "balance_loss", "grad_norm"})
        EXPECT_NEAR(records[i][key].get<double>(), expected[i][key].get<double>(), 1e-5)
            << order << ": " << key << " at step " << i + 1;
    const dstrain::NamedTensors parameters = dstrain::read_parameter_file(dir + "/final_model.h5");
    ASSERT_EQ(parameters.size(), expected_parameters.size()) << order;
    for (size_t i = 0; i < parameters.size(); ++i) {
      ASSERT_EQ(parameters[i].first, expected_parameters[i].first) << order;
      EXPECT_LT((parameters[i].second - expected_parameters[i].second).abs().max().item<double>(), 1e-5)
          << order << ": " << parameters[i].first;
    }
  }
  // One refused order under mpirun: a usage error naming the option, before any step.
  const std::string dir = scratch_dir("order-refused");
  const RunOutput refused = train(orders.refused.front(), dir);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("parallel.order = " + orders.refused.front()), std::string::npos) << refused.output;
  EXPECT_EQ(refused.output.find("step 1/"), std::string::npos) << refused.output;
}

// model info and eval read the same [parallel] options as train: the order, sizes that do not fit
// the model refused alike, and log.rank_groups listing each group's ranks.
TEST(ParallelOrder, ModelInfoAndEvalTakeTheParallelOptionsOfTrain) {
  const std::string v3 = std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny-v3.ini";
  const RunOutput info = run_dstrain(0, {"model", "info", "--config", v3, "--json", "--parallel.pp", "2",
                                         "--parallel.ep", "2", "--parallel.order", "pp-dp"});
  ASSERT_EQ(info.exit_code, 0) << info.output;
  const nlohmann::json planned = nlohmann::json::parse(info.output);
  EXPECT_EQ(planned["layout"]["order"], "pp-tp-cp-ep-dp");
  EXPECT_EQ(planned["layout"]["ranks"], 4);  // the fewest: dp 2, for ep 2
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--parallel.tp", "3"}, "parallel.tp = 3: must divide model.num_heads = 4"},
      {{"--parallel.cp", "3"}, "parallel.cp = 3: train.seq_len = 32 must split into 2 × cp = 6 chunks"},
      {{"--parallel.pp", "2", "--parallel.ep", "2", "--parallel.order", "ep-pp-dp"}, "parallel.order = ep-pp-dp: "}};
  for (const auto& [options, message] : refused) {
    std::vector<std::string> args = {"model", "info", "--config", v3};
    args.insert(args.end(), options.begin(), options.end());
    const RunOutput run = run_dstrain(0, args);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
  }

  const std::string trained = scratch_dir("order-eval-trained");
  const RunOutput train_run =
      train_tiny(1, trained, {"--train.device", "cpu", "--train.steps", "4", "--ckpt.save_final", "true"});
  ASSERT_EQ(train_run.exit_code, 0) << train_run.output;
  auto eval = [&](int ranks, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "eval",           "--ckpt", trained + "/final_model.h5", "--data", test_corpus().valid, "--batches", "2",
        "--train.device", "cpu"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_dstrain(ranks, args);
  };
  const RunOutput one = eval(1, {}), piped = eval(4, {"--parallel.pp", "2", "--parallel.order", "pp-dp",
                                                      "--train.micro_batch", "1", "--log.rank_groups", "true"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  // pp innermost: the stages of a pipeline are neighbours.
  EXPECT_NE(piped.output.find("groups (parallel.order pp-tp-cp-ep-dp): tp 1 cp 1 dp 2 pp 2"), std::string::npos)
      << piped.output;
  EXPECT_NE(piped.output.find("  pp: [0 1] [2 3]"), std::string::npos) << piped.output;
  EXPECT_NE(piped.output.find("  dp: [0 2] [1 3]"), std::string::npos) << piped.output;
  auto loss = [](const std::string& output) {
    const size_t at = output.find("loss ", output.find("eval of "));
    return at == std::string::npos ? -1.0 : std::stod(output.substr(at + 5));
  };
  EXPECT_GT(loss(one.output), 0.0) << one.output;
  EXPECT_NEAR(loss(piped.output), loss(one.output), 1e-5) << piped.output;
  const RunOutput tp = eval(2, {"--parallel.tp", "2"}), odd = eval(3, {"--parallel.tp", "3"});
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  EXPECT_NEAR(loss(tp.output), loss(one.output), 1e-5) << tp.output;
  EXPECT_EQ(odd.exit_code, 2) << odd.output;
  EXPECT_NE(odd.output.find("parallel.tp = 3: must divide model.num_heads = 4"), std::string::npos) << odd.output;
}
