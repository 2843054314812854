// Routed experts with stacked weights (model/grouped_experts.h, model/grouped_projection.h) and
// their checkpoint names (ckpt/expert_layout.h): the grouped product computes bitwise what a
// projection per expert computes, forward and backward, split into B and W or not; the stack is
// seen per expert, under Hugging Face's global names, through views that write the parameter; and
// an optimizer state, whole or a ZeRO-1 shard across experts, splits into the experts' pieces.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "dstrain/ckpt/expert_layout.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/pipeline/weight_gradient_store.h"
#include "dstrain/model/grouped_experts.h"
#include "dstrain/model/grouped_matmul.h"
#include "dstrain/model/grouped_projection.h"
#include "dstrain/model/moe.h"
#include "dstrain/model/transformer.h"

using namespace dstrain;

namespace {

void expect_bitwise(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  EXPECT_TRUE(torch::equal(a, b)) << what << ": largest difference " << (a - b).abs().max().item<double>();
}

// Three experts, the middle one without rows.
struct Experts {
  const std::vector<int64_t> counts{4, 0, 3};
  torch::Tensor rows = torch::randn({7, 6});
  torch::Tensor weights = torch::randn({3, 5, 6});
  torch::Tensor upstream = torch::randn({7, 5});
};

}  // namespace

TEST(GroupedProjection, EqualsAProjectionPerExpertBitwise) {
  torch::manual_seed(3);
  const Experts e;
  torch::Tensor rows = e.rows.clone().requires_grad_(true), weights = e.weights.clone().requires_grad_(true);
  torch::Tensor out = grouped_projection(rows, weights, e.counts);
  out.backward(e.upstream);

  // The same products with a weight tensor per expert, through LibTorch's own linear.
  torch::Tensor plain_rows = e.rows.clone().requires_grad_(true);
  std::vector<torch::Tensor> plain_weights, outputs;
  int64_t start = 0;
  for (size_t x = 0; x < e.counts.size(); ++x) {
    plain_weights.push_back(e.weights[static_cast<int64_t>(x)].clone().requires_grad_(true));
    if (e.counts[x] > 0)
      outputs.push_back(torch::nn::functional::linear(plain_rows.narrow(0, start, e.counts[x]), plain_weights.back()));
    start += e.counts[x];
  }
  torch::Tensor plain = torch::cat(outputs, 0);
  plain.backward(e.upstream);

  expect_bitwise(out, plain, "output");
  expect_bitwise(rows.grad(), plain_rows.grad(), "rows' gradient");
  expect_bitwise(weights.grad()[0], plain_weights[0].grad(), "expert 0's weight gradient");
  expect_bitwise(weights.grad()[2], plain_weights[2].grad(), "expert 2's weight gradient");
  EXPECT_FALSE(plain_weights[1].grad().defined());
  EXPECT_EQ(weights.grad()[1].abs().sum().item<double>(), 0.0) << "an expert without rows";
}

TEST(GroupedProjection, DefersTheWeightGradientToTheWAction) {
  torch::manual_seed(4);
  const Experts e;
  torch::Tensor weights = e.weights.clone().requires_grad_(true);
  torch::Tensor rows = e.rows.clone().requires_grad_(true);
  grouped_projection(rows, weights, e.counts).backward(e.upstream);
  const torch::Tensor rows_grad = rows.grad().clone(), weights_grad = weights.grad().clone();
  weights.mutable_grad().reset();

  torch::Tensor again = e.rows.clone().requires_grad_(true), out;
  WeightGradientStore store;
  {
    WeightGradientStore::Deferral deferral(store);
    out = grouped_projection(again, weights, e.counts, nullptr, &store);
  }
  store.collect({0, 0}, [&] { out.backward(e.upstream); });
  expect_bitwise(again.grad(), rows_grad, "rows' gradient after B");
  EXPECT_FALSE(weights.grad().defined()) << "B computed the weights' gradient";
  store.compute({0, 0});
  expect_bitwise(weights.grad(), weights_grad, "weights' gradient after W");
}

// LibTorch's grouped kernel is for CUDA bf16 (tests/gpu checks it there): the CPU loops.
TEST(GroupedProjection, OnTheCpuTheExpertsLoop) {
  EXPECT_EQ(grouped_matmul_built(), DSTRAIN_TORCH_AT_LEAST(2, 8));
  const torch::Tensor a = torch::randn({16, 8}, torch::kBFloat16), b = torch::randn({2, 8, 8}, torch::kBFloat16);
  EXPECT_FALSE(grouped_matmul_applies(a, b));
  GroupedMatmul grouped;
  EXPECT_FALSE(grouped(a, b, {8, 8}).defined());
  EXPECT_FALSE(grouped.refused()) << "a product that does not apply is no refusal";
}

TEST(GroupedProjection, RefusesRowsThatDoNotMatchTheCounts) {
  EXPECT_THROW(grouped_projection(torch::zeros({5, 6}), torch::zeros({3, 5, 6}), {4, 0, 3}), std::invalid_argument);
  EXPECT_THROW(grouped_projection(torch::zeros({7, 6}), torch::zeros({3, 5, 6}), {4, 3}), std::invalid_argument);
}

TEST(GroupedExperts, CheckpointNamesAreViewsOfTheStack) {
  GroupedExperts experts(2, /*first_expert=*/4, /*hidden=*/3, /*intermediate=*/5);
  std::map<std::string, torch::Tensor> views;
  for (const auto& [name, view] : experts->expert_weights()) views[name] = view;
  ASSERT_EQ(views.size(), 6u);
  EXPECT_EQ(views.at("4.gate_proj.weight").sizes(), torch::IntArrayRef({5, 3}));
  EXPECT_EQ(views.at("5.down_proj.weight").sizes(), torch::IntArrayRef({3, 5}));
  {
    torch::NoGradGuard no_grad;  // as parameters are written
    views.at("5.up_proj.weight").fill_(2.0);
  }
  EXPECT_TRUE(views.at("5.up_proj.weight").requires_grad()) << "a view of a trained parameter";
  const torch::Tensor stacked = experts->named_parameters()["up_proj"];
  EXPECT_EQ(stacked[1].min().item<double>(), 2.0);
  EXPECT_EQ(stacked[0].abs().max().item<double>(), 0.0);

  EXPECT_TRUE(is_stacked_expert_parameter("model.layers.1.mlp.experts.down_proj"));
  EXPECT_FALSE(is_stacked_expert_parameter("model.layers.1.mlp.experts.3.down_proj.weight"));
  EXPECT_FALSE(is_stacked_expert_parameter("model.layers.1.mlp.shared_experts.down_proj.weight"));
  EXPECT_EQ(expert_weight_name("model.layers.1.mlp.experts.down_proj", 12), "model.layers.1.mlp.experts.12.down_proj.weight");
}

// A layer holding the second half of 8 experts: checkpoints see experts 4 to 7 by name, the
// optimizer three stacked tensors.
TEST(GroupedExperts, ModelParametersAreNamedPerExpertAndHeldStacked) {
  ModelConfig c;
  c.hidden_size = 8;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 4;
  struct SecondHalf : LocalExpertExchange {  // (naming needs no exchange of rows)
    ExpertShard shard() const override { return {1, 2}; }
  } half;
  ComputeOptions options;
  options.expert_exchange = &half;
  MoE moe(c, options);
  std::map<std::string, std::vector<int64_t>> named, held;
  for (const auto& [name, p] : sorted_parameters(*moe)) named[name] = p.sizes().vec();
  for (const auto& [name, p] : module_parameters(*moe)) held[name] = p.sizes().vec();
  for (int64_t e = 4; e < 8; ++e) {
    const std::string prefix = "experts." + std::to_string(e) + ".";
    EXPECT_EQ(named[prefix + "gate_proj.weight"], (std::vector<int64_t>{4, 8}));
    EXPECT_EQ(named[prefix + "down_proj.weight"], (std::vector<int64_t>{8, 4}));
  }
  EXPECT_EQ(named.count("experts.3.gate_proj.weight"), 0u);
  EXPECT_EQ(named.count("experts.gate_proj"), 0u);
  EXPECT_EQ(held.at("experts.gate_proj"), (std::vector<int64_t>{4, 4, 8}));
  EXPECT_EQ(held.at("experts.down_proj"), (std::vector<int64_t>{4, 8, 4}));
  EXPECT_EQ(held.count("experts.4.gate_proj.weight"), 0u);
  EXPECT_EQ(named.count("gate.weight"), 1u);
  EXPECT_EQ(held.count("gate.weight"), 1u);
}

namespace {

OptimizerStateView stacked_state(const std::string& name, int64_t offset, int64_t numel, bool separate_master) {
  OptimizerStateView s;
  s.name = name;
  s.param = torch::arange(numel, torch::kFloat32);
  s.master = separate_master ? torch::arange(numel, torch::kFloat32) + 100 : s.param;
  s.exp_avg = torch::zeros({numel});
  s.exp_avg_sq = torch::zeros({numel});
  s.full_shape = {3, 2, 2};
  s.offset = offset;
  return s;
}

}  // namespace

// A ZeRO-1 shard of elements 3 to 8 of [3 experts, 2, 2]: the end of the first expert, the
// second whole, the start of the third.
TEST(ExpertLayout, AShardAcrossExpertsSplitsIntoTheirPieces) {
  const std::string stacked = "model.layers.1.mlp.experts.up_proj";
  const OptimizerStateView shard = stacked_state(stacked, 3, 6, /*separate_master=*/true);
  const OptimizerStateView norm = {"model.norm.weight", torch::ones({2}), torch::ones({2}), torch::zeros({2}),
                                   torch::zeros({2}), {2}, 0};
  const std::vector<OptimizerStateView> parts = per_expert_state_views({norm, shard}, /*first_expert=*/6);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].name, "model.norm.weight");
  const std::vector<std::string> names = {"model.layers.1.mlp.experts.6.up_proj.weight",
                                          "model.layers.1.mlp.experts.7.up_proj.weight",
                                          "model.layers.1.mlp.experts.8.up_proj.weight"};
  const std::vector<int64_t> offsets = {3, 0, 0}, sizes = {1, 4, 1};
  for (size_t i = 0; i < 3; ++i) {
    const OptimizerStateView& p = parts[i + 1];
    EXPECT_EQ(p.name, names[i]);
    EXPECT_EQ(p.full_shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(p.offset, offsets[i]) << p.name;
    EXPECT_EQ(p.master.numel(), sizes[i]) << p.name;
    EXPECT_FALSE(p.master.is_same(p.param)) << p.name;
  }
  EXPECT_EQ(parts[2].master.sizes(), torch::IntArrayRef({2, 2})) << "a whole expert keeps its shape";
  EXPECT_EQ(parts[2].master[0][0].item<double>(), 101.0) << "element 4 of the stack, the shard's second";
  parts[3].exp_avg.fill_(7.0);
  EXPECT_EQ(shard.exp_avg[5].item<double>(), 7.0) << "the pieces are views of the optimizer's state";
  EXPECT_EQ(shard.exp_avg.sum().item<double>(), 7.0);
}

TEST(ExpertLayout, AWholeStateSplitsIntoWholeExperts) {
  const OptimizerStateView whole = stacked_state("model.layers.2.mlp.experts.gate_proj", 0, 12, /*separate_master=*/false);
  const std::vector<OptimizerStateView> parts = per_expert_state_views({whole}, 0);
  ASSERT_EQ(parts.size(), 3u);
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(parts[e].name, "model.layers.2.mlp.experts." + std::to_string(e) + ".gate_proj.weight");
    EXPECT_EQ(parts[e].offset, 0);
    EXPECT_EQ(parts[e].param.sizes(), torch::IntArrayRef({2, 2}));
    EXPECT_TRUE(parts[e].master.is_same(parts[e].param)) << "an fp32 model's master is its parameter";
    EXPECT_EQ(parts[e].param[1][1].item<double>(), static_cast<double>(4 * e + 3));
  }
}
