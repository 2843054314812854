// DeepSeekMoE against direct computations: the router's choice (softmax and sigmoid scores,
// greedy and group-limited), the layer's output token by token, the sequence-wise balance loss,
// and the auxiliary-loss-free bias steering a skewed router toward balance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "dstrain/core/text.h"
#include "dstrain/model/moe.h"
#include "dstrain/model/transformer.h"

using namespace dstrain;

namespace {

// The value an option of this name reads as.
template <typename Enum>
Enum named(const EnumNames<Enum>& names, const std::string& name) {
  for (const auto& [text, value] : names)
    if (text == name) return value;
  ADD_FAILURE() << "no value named " << name;
  return names.front().second;
}

ModelConfig moe_config(const std::string& scoring, const std::string& method, int64_t groups, int64_t topk_group) {
  ModelConfig c;
  c.hidden_size = 12;
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 6;
  c.num_experts_per_tok = 2;
  c.scoring_func = named(scoring_function_names(), scoring);
  c.topk_method = named(topk_method_names(), method);
  c.n_group = groups;
  c.topk_group = topk_group;
  c.norm_topk_prob = scoring == "sigmoid";
  c.routed_scaling_factor = 2.5;
  return c;
}

std::set<int64_t> chosen(const Routing& r, int64_t token) {
  std::set<int64_t> experts;
  for (int64_t j = 0; j < r.experts.size(1); ++j) experts.insert(r.experts[token][j].item<int64_t>());
  return experts;
}

// The choice written out: scores, groups ranked by max (V2) or top-2 sum (V3), top-k in the
// allowed groups; weights renormalised and scaled.
std::map<int64_t, double> direct_choice(const std::vector<double>& logits, const std::vector<double>& bias,
                                        const ModelConfig& c) {
  const size_t E = logits.size();
  std::vector<double> score(E), choice(E);
  double total = 0;
  for (size_t i = 0; i < E; ++i) total += std::exp(logits[i]);
  for (size_t i = 0; i < E; ++i) {
    score[i] =
        c.scoring_func == ScoringFunction::kSigmoid ? 1 / (1 + std::exp(-logits[i])) : std::exp(logits[i]) / total;
    choice[i] = score[i] + (bias.empty() ? 0.0 : bias[i]);
  }
  const size_t per_group = E / static_cast<size_t>(c.n_group);
  std::vector<bool> allowed(E, true);
  if (c.n_group > 1 && c.topk_method != TopkMethod::kGreedy) {
    std::vector<std::pair<double, size_t>> groups;
    for (size_t g = 0; g < static_cast<size_t>(c.n_group); ++g) {
      std::vector<double> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      std::sort(members.rbegin(), members.rend());
      groups.push_back({c.topk_method == TopkMethod::kNoauxTc ? members[0] + members[1] : members[0], g});
    }
    std::sort(groups.rbegin(), groups.rend());
    std::fill(allowed.begin(), allowed.end(), false);
    for (size_t g = 0; g < static_cast<size_t>(c.topk_group); ++g)
      for (size_t i = 0; i < per_group; ++i) allowed[groups[g].second * per_group + i] = true;
  }
  std::vector<std::pair<double, size_t>> candidates;
  for (size_t i = 0; i < E; ++i)
    if (allowed[i]) candidates.push_back({choice[i], i});
  std::sort(candidates.rbegin(), candidates.rend());
  std::map<int64_t, double> weights;
  double sum = 0;
  for (int64_t j = 0; j < c.num_experts_per_tok; ++j) sum += score[candidates[j].second];
  for (int64_t j = 0; j < c.num_experts_per_tok; ++j) {
    const size_t e = candidates[j].second;
    weights[static_cast<int64_t>(e)] = score[e] / (c.norm_topk_prob ? sum : 1.0) * c.routed_scaling_factor;
  }
  return weights;
}

std::vector<double> row(const torch::Tensor& t) {
  torch::Tensor d = t.to(torch::kFloat64).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace

TEST(MoE, RoutingMatchesADirectComputationForEveryScoringAndGrouping) {
  torch::manual_seed(5);
  for (const auto& [scoring, method, groups, topk_group] :
       {std::tuple{"softmax", "greedy", 1, 1}, std::tuple{"softmax", "group_limited_greedy", 4, 2},
        std::tuple{"sigmoid", "noaux_tc", 4, 2}, std::tuple{"sigmoid", "greedy", 1, 1}}) {
    ModelConfig c = moe_config(scoring, method, groups, topk_group);
    torch::Tensor logits = torch::randn({64, 8});
    torch::Tensor bias = method == std::string("noaux_tc") ? torch::randn({8}) * 0.1 : torch::Tensor();
    Routing r = route_tokens(logits, bias, c);
    for (int64_t t = 0; t < logits.size(0); ++t) {
      std::map<int64_t, double> expected = direct_choice(row(logits[t]), bias.defined() ? row(bias) : std::vector<double>{}, c);
      ASSERT_EQ(chosen(r, t).size(), 2u);
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t e = r.experts[t][j].item<int64_t>();
        ASSERT_EQ(expected.count(e), 1u) << method << " token " << t;
        EXPECT_NEAR(r.weights[t][j].item<double>(), expected[e], 1e-6) << method << " token " << t;
      }
    }
  }
}

// Expert 0 scores best, but its group's second expert is poor: ranking groups by their best
// score (V2) keeps group 0; by their two best (V3) it loses to group 1; greedy ignores groups.
TEST(MoE, GroupsChangeTheChoice) {
  torch::Tensor logits = torch::tensor({{3.0f, -3.0f, 2.0f, 1.9f, -1.0f, -1.0f, -2.0f, -2.0f}});
  ModelConfig c = moe_config("softmax", "greedy", 4, 1);
  EXPECT_EQ(chosen(route_tokens(logits, {}, c), 0), (std::set<int64_t>{0, 2}));
  c.topk_method = TopkMethod::kGroupLimitedGreedy;
  EXPECT_EQ(chosen(route_tokens(logits, {}, c), 0), (std::set<int64_t>{0, 1}));
  c.topk_method = TopkMethod::kNoauxTc;
  c.scoring_func = ScoringFunction::kSigmoid;
  c.norm_topk_prob = true;
  EXPECT_EQ(chosen(route_tokens(logits, {}, c), 0), (std::set<int64_t>{2, 3}));
  // The bias steers the choice, not the weights.
  torch::Tensor bias = torch::tensor({0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 2.f, 2.f});
  Routing r = route_tokens(logits, bias, c);
  EXPECT_EQ(chosen(r, 0), (std::set<int64_t>{6, 7}));
  EXPECT_NEAR(r.weights[0][0].item<double>(), 0.5 * 2.5, 1e-6);  // equal scores, renormalised
}

// The layer's output token by token: shared expert + Σ weight × SwiGLU expert, from the weights.
TEST(MoE, OutputMatchesAPerTokenComputation) {
  torch::manual_seed(11);
  ModelConfig c = moe_config("sigmoid", "noaux_tc", 4, 2);
  MoE moe(c);
  std::map<std::string, torch::Tensor> w;
  for (auto& [name, p] : sorted_parameters(*moe)) {  // the experts by their checkpoint names
    torch::NoGradGuard no_grad;
    if (!ends_with(name, "e_score_correction_bias")) p.normal_(0, 0.5);
    w[name] = p.detach();
  }
  moe->eval();
  torch::Tensor x = torch::randn({2, 5, c.hidden_size});
  torch::Tensor got;
  {
    torch::NoGradGuard no_grad;
    got = moe(x);
  }
  auto swiglu = [&](const std::string& prefix, const torch::Tensor& v) {
    torch::Tensor gate = torch::matmul(w[prefix + "gate_proj.weight"], v), up = torch::matmul(w[prefix + "up_proj.weight"], v);
    return torch::matmul(w[prefix + "down_proj.weight"], gate / (1 + torch::exp(-gate)) * up);
  };
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 5; ++s) {
      torch::Tensor v = x[b][s];
      torch::Tensor expected = swiglu("shared_experts.", v);
      for (const auto& [e, weight] : direct_choice(row(torch::matmul(w["gate.weight"], v)), row(w["gate.e_score_correction_bias"]), c))
        expected = expected + swiglu("experts." + std::to_string(e) + ".", v) * weight;
      EXPECT_LT((got[b][s] - expected).abs().max().item<double>(), 1e-5) << "token " << b << "," << s;
    }
}

TEST(MoE, SequenceBalanceLossEqualsTheFormula) {
  torch::manual_seed(2);
  ModelConfig c = moe_config("sigmoid", "greedy", 1, 1);
  c.aux_loss_alpha = 0.01;
  const int64_t sequences = 3, T = 6, E = 8, k = 2;
  Routing r = route_tokens(torch::randn({sequences * T, E}), {}, c);
  double expected = 0;
  for (int64_t s = 0; s < sequences; ++s) {
    for (int64_t i = 0; i < E; ++i) {
      double count = 0, p = 0;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t token = s * T + t;
        count += static_cast<double>(chosen(r, token).count(i));
        p += r.scores[token][i].item<double>() / r.scores[token].sum().item<double>();
      }
      expected += (static_cast<double>(E) / (k * T) * count) * (p / T);
    }
  }
  expected = expected / sequences * c.aux_loss_alpha;
  EXPECT_NEAR(sequence_balance_loss(r, sequences, c).item<double>(), expected, 1e-7);

  // The layer sums the losses of its training forward passes for the metrics, until the step's
  // bias update restarts them; evaluation adds nothing.
  MoE moe(c);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : moe->named_parameters()) item.value().normal_(0, 0.3);
  }
  double sum = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const torch::Tensor x = torch::randn({sequences, T, c.hidden_size});
    const torch::Tensor logits = torch::nn::functional::linear(x.reshape({sequences * T, c.hidden_size}),
                                                               moe->named_parameters()["gate.weight"]);
    sum += sequence_balance_loss(route_tokens(logits, {}, c), sequences, c).item<double>();
    moe(x);
  }
  EXPECT_NEAR(moe->balance_loss().item<double>(), sum, 1e-6);
  moe->eval();
  moe(torch::randn({sequences, T, c.hidden_size}));
  EXPECT_NEAR(moe->balance_loss().item<double>(), sum, 1e-6);
  moe->update_bias(moe->expert_load(), 0.01, torch::zeros({}));
  EXPECT_EQ(moe->balance_loss().item<double>(), 0.0);
}

// A router that sends most tokens to expert 0: updating the bias from the loads (gamma 0.01)
// brings the busiest expert's load toward the mean.
TEST(MoE, BiasUpdatesMoveASkewedRouterTowardBalance) {
  torch::manual_seed(4);
  ModelConfig c = moe_config("sigmoid", "noaux_tc", 1, 1);
  MoE moe(c);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : moe->named_parameters())
      if (item.value().requires_grad()) item.value().normal_(0, 0.1);
    moe->named_parameters()["gate.weight"][0].fill_(0.5);  // expert 0 wins for inputs of positive sum
  }
  torch::Tensor x = torch::randn({4, 16, c.hidden_size}).abs();
  auto imbalance = [&] {
    torch::NoGradGuard no_grad;
    moe->expert_load().zero_();
    moe(x);
    torch::Tensor load = moe->expert_load().clone();
    return std::make_pair((load.max() / load.mean()).item<double>(), load);
  };
  const double before = imbalance().first;
  EXPECT_GT(before, 3.0);
  const torch::Tensor taken = torch::zeros({}), skipped = torch::ones({});
  for (int step = 0; step < 200; ++step) moe->update_bias(imbalance().second, 0.01, taken);
  const double after = imbalance().first;
  EXPECT_LT(after, before / 2) << "before " << before << ", after " << after;
  EXPECT_LT(moe->bias()[0].item<double>(), 0.0);  // the favourite was pushed down

  // A skipped step (non-finite gradients) moves no bias, and its counts are dropped.
  const torch::Tensor bias = moe->bias().clone();
  moe->update_bias(imbalance().second, 0.01, skipped);
  EXPECT_TRUE(torch::equal(moe->bias(), bias));
  EXPECT_EQ(moe->expert_load().sum().item<double>(), 0.0);
}
