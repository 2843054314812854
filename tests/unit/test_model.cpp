#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "dstrain/core/step_memory.h"
#include "dstrain/model/linear_cross_entropy.h"
#include "dstrain/model/transformer.h"
#include "arrival_counter.h"

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
  torch::manual_seed(31);  // reproducible inputs (the default generator starts at random)
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
  torch::manual_seed(32);  // reproducible inputs (the default generator starts at random)
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
  torch::manual_seed(33);  // reproducible inputs (the default generator starts at random)
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

TEST(Model, LossIsTheMeanNextTokenCrossEntropyOfTheHeadsLogits) {
  torch::manual_seed(3);
  torch::Tensor hidden = torch::randn({2, 3, 4});
  torch::Tensor weight = torch::randn({5, 4});
  torch::Tensor targets = torch::tensor({{1, 4, 0}, {2, 2, 3}}, torch::kInt64);
  double expected = 0;
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 3; ++s) {
      double logits[5], sum = 0;
      for (int v = 0; v < 5; ++v) {
        logits[v] = 0;
        for (int h = 0; h < 4; ++h) logits[v] += hidden[b][s][h].item<double>() * weight[v][h].item<double>();
        sum += std::exp(logits[v]);
      }
      expected += std::log(sum) - logits[targets[b][s].item<int64_t>()];
    }
  for (int64_t chunk_rows : {0, 1, 4}) {
    EXPECT_NEAR(linear_cross_entropy(hidden, weight, targets, chunk_rows).item<double>(), expected / 6, 1e-5);
    torch::NoGradGuard evaluation;
    EXPECT_NEAR(linear_cross_entropy(hidden, weight, targets, chunk_rows).item<double>(), expected / 6, 1e-5);
  }
  // A target for each row, or a message saying how many there are of each.
  EXPECT_THROW(linear_cross_entropy(hidden, weight, targets.narrow(1, 0, 2)), std::invalid_argument);
}

// The loss and gradients of log_softmax + nll_loss over the materialised logits, in fp64 unless
// told otherwise.
struct ReferenceLoss {
  torch::Tensor loss, grad_hidden, grad_weight;
};
ReferenceLoss reference_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                             double upstream, torch::ScalarType dtype = torch::kFloat64) {
  torch::Tensor h = hidden.detach().to(dtype).requires_grad_();
  torch::Tensor w = weight.detach().to(dtype).requires_grad_();
  torch::Tensor logits = torch::matmul(h, w.t());
  torch::Tensor loss = torch::nll_loss(torch::log_softmax(logits.reshape({-1, w.size(0)}), -1), targets.reshape({-1}));
  (loss * upstream).backward();
  return {loss.detach().to(torch::kFloat64), h.grad().to(torch::kFloat64), w.grad().to(torch::kFloat64)};
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kFloat64) - want).norm() / want.norm()).item<double>();
}

TEST(Model, FusedHeadLossGradientsEqualThoseOfTheMaterialisedLogits) {
  torch::manual_seed(5);
  torch::Tensor targets = torch::randint(0, 37, {3, 5}, torch::kInt64);
  torch::Tensor weight = torch::randn({37, 8});
  torch::Tensor hidden = torch::randn({3, 5, 8});
  // A confident row (softmax near one at the target): a probability rounded before subtracting
  // one would lose its target's gradient.
  // The target's weight row grows along the hidden vector until p passes 0.999.
  const int64_t confident = targets[0][0].item<int64_t>();
  const torch::Tensor direction = hidden[0][0] / hidden[0][0].norm();
  double p = 0;
  for (double length = 1; p < 0.999; length *= 1.05) {
    weight[confident].copy_(direction * length);
    p = torch::softmax(torch::matmul(hidden[0][0], weight.t()).to(torch::kFloat64), -1)[confident].item<double>();
  }
  ASSERT_LT(p, 0.9999);
  const double upstream = 2.5;  // as a loss scale or a micro-batch divisor multiplies it
  ReferenceLoss expected = reference_loss(hidden, weight, targets, upstream);
  ReferenceLoss materialised = reference_loss(hidden, weight, targets, upstream, torch::kFloat32);

  for (int64_t chunk_rows : {0, 1, 4, 15}) {
    torch::Tensor h = hidden.clone().requires_grad_(), w = weight.clone().requires_grad_();
    torch::Tensor loss = linear_cross_entropy(h, w, targets, chunk_rows);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
    (loss * upstream).backward();
    EXPECT_NEAR(loss.item<double>(), expected.loss.item<double>(), 1e-6) << chunk_rows;
    EXPECT_LT(relative_error(h.grad(), expected.grad_hidden), 1e-6) << chunk_rows;
    EXPECT_LT(relative_error(w.grad(), expected.grad_weight), 1e-6) << chunk_rows;
    // The confident row's gradient, where p - 1 cancels: as close as fp32 log_softmax + nll_loss.
    EXPECT_LE(relative_error(h.grad()[0][0], expected.grad_hidden[0][0]),
              2 * relative_error(materialised.grad_hidden[0][0], expected.grad_hidden[0][0]))
        << chunk_rows;
  }

  // bf16 hidden and weight: an fp32 loss and bf16 gradients within bf16's rounding of the fp64
  // ones computed from the same bf16 values.
  torch::Tensor h16 = hidden.to(torch::kBFloat16).requires_grad_();
  torch::Tensor w16 = weight.to(torch::kBFloat16).requires_grad_();
  ReferenceLoss rounded = reference_loss(h16, w16, targets, upstream);
  torch::Tensor loss16 = linear_cross_entropy(h16, w16, targets, 4);
  EXPECT_EQ(loss16.scalar_type(), torch::kFloat32);
  (loss16 * upstream).backward();
  EXPECT_EQ(h16.grad().scalar_type(), torch::kBFloat16);
  // The logits themselves are rounded to bf16 before the softmax: about 2^-8 of a logit.
  EXPECT_NEAR(loss16.item<double>(), rounded.loss.item<double>(), 0.05);
  EXPECT_LT(relative_error(h16.grad(), rounded.grad_hidden), 0.02);
  EXPECT_LT(relative_error(w16.grad(), rounded.grad_weight), 0.02);
  // The confident row: p rounded to bf16 (1.0) before subtracting one would lose it (error ~1).
  EXPECT_LT(relative_error(h16.grad()[0][0], rounded.grad_hidden[0][0]), 0.05);
}

// A head weight whose gradient already exists (the gradient buffer's view, in training) gets the
// product added into that tensor, with no [vocabulary, hidden] tensor made on the way: the
// backward pass of two heads sharing the weight (as a multi-token prediction module's does)
// allocates less than one such tensor, leaves the gradient where it was, holding what was there
// plus both heads' fp64 gradients, and still runs the weight's accumulator once, so that a
// gradient buffer counts the arrival.
TEST(Model, TheHeadWeightsGradientIsAddedIntoTheOneThatExists) {
  torch::manual_seed(9);
  const torch::Tensor weight = torch::randn({4096, 8}), hidden = torch::randn({2, 6, 8});
  const torch::Tensor targets = torch::randint(0, 4096, {2, 6}, torch::kInt64);
  const torch::Tensor earlier = torch::randn({4096, 8});  // an earlier micro-batch's, say
  ReferenceLoss first = reference_loss(hidden, weight, targets, 1.0);
  ReferenceLoss second = reference_loss(hidden * 0.5, weight, targets, 3.0);

  torch::Tensor w = weight.clone().requires_grad_();
  w.mutable_grad() = earlier.clone();
  const void* home = w.grad().data_ptr();
  int runs = 0;
  auto accumulator = torch::autograd::impl::grad_accumulator(w);
  accumulator->add_post_hook(std::make_unique<test::ArrivalCounter>(&runs));
  torch::Tensor h = hidden.clone().requires_grad_();
  torch::Tensor loss = linear_cross_entropy(h, w, targets) + 3.0 * linear_cross_entropy(h * 0.5, w, targets);
  accel::StepMemoryMeter meter(torch::kCPU);
  meter.begin_step();
  loss.backward();
  meter.end_step();

  EXPECT_LT(meter.peak_bytes(), static_cast<int64_t>(w.nbytes()));
  EXPECT_EQ(w.grad().data_ptr(), home);
  EXPECT_LT(relative_error(w.grad(), earlier.to(torch::kFloat64) + first.grad_weight + second.grad_weight), 1e-6);
  EXPECT_EQ(runs, 1);
}
