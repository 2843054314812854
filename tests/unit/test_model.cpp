#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "dstrain/model/transformer.h"

using namespace dstrain;

namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_seq_len = 16;
  return c;
}

}  // namespace

TEST(Model, ShapesAndHuggingFaceNames) {
  ModelConfig c = small_config();
  CausalLM model(c, LayerSlice::whole(c));
  torch::Tensor ids = torch::randint(0, c.vocab_size, {2, 10}, torch::kInt64);
  EXPECT_EQ(model(ids).sizes(), (std::vector<int64_t>{2, 10, 50}));

  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, p] : sorted_parameters(*model)) shapes[name] = p.sizes().vec();
  EXPECT_EQ(shapes.size(), 3u + 3u * 9u);  // embed, norm, lm_head + 9 per layer
  EXPECT_EQ(shapes["model.embed_tokens.weight"], (std::vector<int64_t>{50, 32}));
  EXPECT_EQ(shapes["model.layers.2.self_attn.q_proj.weight"], (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(shapes["model.layers.2.self_attn.k_proj.weight"], (std::vector<int64_t>{16, 32}));  // GQA
  EXPECT_EQ(shapes["model.layers.0.mlp.down_proj.weight"], (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(shapes["model.layers.1.post_attention_layernorm.weight"], (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes["model.norm.weight"], (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{50, 32}));
}

TEST(Model, ChangingALaterTokenNeverChangesAnEarlierLogit) {
  ModelConfig c = small_config();
  CausalLM model(c, LayerSlice::whole(c));
  initialize_parameters(*model, c, 7);
  torch::NoGradGuard no_grad;
  torch::Tensor ids = torch::randint(0, c.vocab_size, {1, 12}, torch::kInt64);
  torch::Tensor before = model(ids);
  for (int64_t changed : {11, 6, 1}) {
    torch::Tensor other = ids.clone();
    other[0][changed] = (other[0][changed].item<int64_t>() + 1) % c.vocab_size;
    torch::Tensor after = model(other);
    EXPECT_TRUE(torch::equal(before.narrow(1, 0, changed), after.narrow(1, 0, changed))) << changed;
    EXPECT_FALSE(torch::allclose(before.narrow(1, changed, 1), after.narrow(1, changed, 1))) << changed;
  }
}

// RoPE against the textbook formula, element by element, for both layouts.
TEST(Model, RopeMatchesTheDirectFormula) {
  const int64_t seq = 7, d = 8;
  const double theta = 500.0;
  torch::Tensor x = torch::randn({1, 2, seq, d}, torch::kFloat64).to(torch::kFloat32);
  for (bool interleave : {false, true}) {
    torch::Tensor got = apply_rope(x, make_rope_tables(16, d, theta, interleave));
    auto a = x.accessor<float, 4>();
    auto out = got.accessor<float, 4>();
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t p = 0; p < seq; ++p) {
        for (int64_t i = 0; i < d / 2; ++i) {
          double angle = p * std::pow(theta, -2.0 * i / d);
          int64_t first = interleave ? 2 * i : i, second = interleave ? 2 * i + 1 : i + d / 2;
          double x0 = a[0][h][p][first], x1 = a[0][h][p][second];
          EXPECT_NEAR(out[0][h][p][first], x0 * std::cos(angle) - x1 * std::sin(angle), 1e-5);
          EXPECT_NEAR(out[0][h][p][second], x0 * std::sin(angle) + x1 * std::cos(angle), 1e-5);
        }
      }
    }
  }
}

// Grouped-query attention against a loop over heads with explicit softmax and causal mask.
TEST(Model, AttentionMatchesAnExplicitPerHeadComputation) {
  ModelConfig c = small_config();
  Attention attention(c);
  torch::NoGradGuard no_grad;
  const int64_t seq = 6, hd = c.head_dim();
  torch::Tensor x = torch::randn({1, seq, c.hidden_size});
  RopeTables rope = make_rope_tables(c.max_seq_len, hd, c.rope_theta, false);
  torch::Tensor got = attention(x, rope);

  std::map<std::string, torch::Tensor> w;
  for (auto& item : attention->named_parameters()) w[item.key()] = item.value();
  torch::Tensor q = torch::matmul(x[0], w["q_proj.weight"].t());  // [S, nh × hd]
  torch::Tensor k = torch::matmul(x[0], w["k_proj.weight"].t());
  torch::Tensor v = torch::matmul(x[0], w["v_proj.weight"].t());
  std::vector<torch::Tensor> heads;
  for (int64_t h = 0; h < c.num_heads; ++h) {
    int64_t kv = h / (c.num_heads / c.num_kv_heads);
    torch::Tensor qh = apply_rope(q.narrow(1, h * hd, hd).view({1, 1, seq, hd}), rope)[0][0];
    torch::Tensor kh = apply_rope(k.narrow(1, kv * hd, hd).view({1, 1, seq, hd}), rope)[0][0];
    torch::Tensor vh = v.narrow(1, kv * hd, hd);
    torch::Tensor out = torch::zeros({seq, hd});
    for (int64_t i = 0; i < seq; ++i) {
      std::vector<double> scores;
      double top = -1e30, total = 0;
      for (int64_t j = 0; j <= i; ++j) {
        scores.push_back(torch::dot(qh[i], kh[j]).item<double>() / std::sqrt(static_cast<double>(hd)));
        top = std::max(top, scores.back());
      }
      for (double& s : scores) total += (s = std::exp(s - top));
      for (int64_t j = 0; j <= i; ++j) out[i] += vh[j] * (scores[j] / total);
    }
    heads.push_back(out);
  }
  torch::Tensor expected = torch::matmul(torch::cat(heads, 1), w["o_proj.weight"].t());
  EXPECT_TRUE(torch::allclose(got[0], expected, 1e-4, 1e-5)) << (got[0] - expected).abs().max();
}

TEST(Model, InitialisationDependsOnlyOnSeedAndName) {
  ModelConfig c = small_config();
  CausalLM whole(c, LayerSlice::whole(c));
  CausalLM tail(c, LayerSlice{2, 3, false, true});  // a last pipeline stage: layer 2 and the head
  initialize_parameters(*whole, c, 42);
  initialize_parameters(*tail, c, 42);
  std::map<std::string, torch::Tensor> by_name;
  for (auto& [name, p] : sorted_parameters(*whole)) by_name[name] = p;
  auto tail_params = sorted_parameters(*tail);
  ASSERT_EQ(tail_params.size(), 9u + 2u);
  for (auto& [name, p] : tail_params) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_TRUE(torch::equal(p, by_name[name])) << name;
  }
  EXPECT_TRUE(torch::equal(by_name["model.norm.weight"], torch::ones({c.hidden_size})));
  // Output projections get std / sqrt(2 × layers); others init_std.
  double std_q = by_name["model.layers.0.self_attn.q_proj.weight"].std().item<double>();
  double std_o = by_name["model.layers.0.self_attn.o_proj.weight"].std().item<double>();
  EXPECT_NEAR(std_q, 0.02, 0.004);
  EXPECT_NEAR(std_o, 0.02 / std::sqrt(6.0), 0.002);

  CausalLM other_seed(c, LayerSlice::whole(c));
  initialize_parameters(*other_seed, c, 43);
  EXPECT_FALSE(torch::equal(sorted_parameters(*other_seed)[0].second, sorted_parameters(*whole)[0].second));
}

TEST(Model, LossIsTheMeanNextTokenCrossEntropy) {
  torch::Tensor logits = torch::randn({2, 3, 5});
  torch::Tensor targets = torch::tensor({{1, 4, 0}, {2, 2, 3}}, torch::kInt64);
  double expected = 0;
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 3; ++s) {
      torch::Tensor row = logits[b][s];
      expected += (row.exp().sum().log() - row[targets[b][s].item<int64_t>()]).item<double>();
    }
  EXPECT_NEAR(lm_loss(logits, targets).item<double>(), expected / 6, 1e-5);
}
