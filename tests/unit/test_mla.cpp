// Multi-head Latent Attention against a direct computation from its weights: explicit RMSNorm,
// RoPE on interleaved pairs written out, softmax per query position, head by head.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "dstrain/model/mla.h"
#include "dstrain/model/transformer.h"

using namespace dstrain;

namespace {

ModelConfig mla_config(int64_t q_lora_rank) {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 24;
  c.intermediate_size = 32;
  c.num_layers = 2;
  c.num_heads = 3;
  c.max_seq_len = 16;
  c.rope_interleave = true;
  c.q_lora_rank = q_lora_rank;
  c.kv_lora_rank = 10;
  c.qk_nope_head_dim = 6;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 5;
  return c;
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x / (x.pow(2).mean(-1, true) + eps).sqrt() * w;
}

// Rotation of one vector at position p, pairs (2i, 2i+1), frequency theta^(-2i/d).
torch::Tensor rotate(const torch::Tensor& v, int64_t p, double theta) {
  const int64_t d = v.size(0);
  torch::Tensor out = v.clone();
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * i / static_cast<double>(d));
    const double a = v[2 * i].item<double>(), b = v[2 * i + 1].item<double>();
    out[2 * i] = a * std::cos(angle) - b * std::sin(angle);
    out[2 * i + 1] = b * std::cos(angle) + a * std::sin(angle);
  }
  return out;
}

// The latent norms take RMSNorm's default epsilon, 1e-6, as DeepSeek's code builds them.
torch::Tensor direct_mla(const ModelConfig& c, std::map<std::string, torch::Tensor>& w, const torch::Tensor& x) {
  const int64_t seq = x.size(0), H = c.num_heads, nope = c.qk_nope_head_dim, r = c.qk_rope_head_dim, vd = c.v_head_dim;
  torch::Tensor q = c.q_lora_rank > 0
                        ? torch::matmul(rms_norm(torch::matmul(x, w["q_a_proj.weight"].t()), w["q_a_layernorm.weight"], 1e-6),
                                        w["q_b_proj.weight"].t())
                        : torch::matmul(x, w["q_proj.weight"].t());  // [S, H (nope + r)]
  torch::Tensor compressed = torch::matmul(x, w["kv_a_proj_with_mqa.weight"].t());
  torch::Tensor latent = rms_norm(compressed.narrow(1, 0, c.kv_lora_rank), w["kv_a_layernorm.weight"], 1e-6);
  torch::Tensor kv = torch::matmul(latent, w["kv_b_proj.weight"].t());  // [S, H (nope + v)]
  const double scale = 1.0 / std::sqrt(static_cast<double>(nope + r));
  torch::Tensor out = torch::zeros({seq, H * vd}, torch::kFloat64);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < seq; ++i) {
      torch::Tensor qi = torch::cat({q[i].narrow(0, h * (nope + r), nope),
                                     rotate(q[i].narrow(0, h * (nope + r) + nope, r), i, c.rope_theta)});
      std::vector<double> scores;
      double top = -1e300;
      for (int64_t j = 0; j <= i; ++j) {
        torch::Tensor kj = torch::cat({kv[j].narrow(0, h * (nope + vd), nope),
                                       rotate(compressed[j].narrow(0, c.kv_lora_rank, r), j, c.rope_theta)});
        scores.push_back(torch::dot(qi, kj).item<double>() * scale);
        top = std::max(top, scores.back());
      }
      double total = 0;
      for (double& s : scores) total += (s = std::exp(s - top));
      for (int64_t j = 0; j <= i; ++j)
        out[i].narrow(0, h * vd, vd) += kv[j].narrow(0, h * (nope + vd) + nope, vd) * (scores[j] / total);
    }
  }
  return torch::matmul(out, w["o_proj.weight"].t());
}

}  // namespace

TEST(MultiHeadLatentAttention, MatchesADirectComputationWithAndWithoutQueryCompression) {
  for (int64_t q_lora_rank : {0, 12}) {
    torch::manual_seed(3);
    ModelConfig c = mla_config(q_lora_rank);
    c.rms_norm_eps = 0.5;  // the decoder's norms': the latent norms keep 1e-6
    MultiHeadLatentAttention mla(c);
    mla->to(torch::kFloat64);
    std::map<std::string, torch::Tensor> w;
    for (auto& item : mla->named_parameters()) {
      torch::NoGradGuard no_grad;
      item.value().normal_(0, 0.3);  // norms too: their weights take part
      w[item.key()] = item.value().detach();
    }
    EXPECT_EQ(w.count("q_proj.weight"), q_lora_rank == 0 ? 1u : 0u);
    EXPECT_EQ(w.count("q_a_proj.weight"), q_lora_rank == 0 ? 0u : 1u);
    EXPECT_EQ(w["kv_a_proj_with_mqa.weight"].sizes(), (std::vector<int64_t>{10 + 4, 24}));
    EXPECT_EQ(w["kv_b_proj.weight"].sizes(), (std::vector<int64_t>{3 * (6 + 5), 10}));
    EXPECT_EQ(w["o_proj.weight"].sizes(), (std::vector<int64_t>{24, 3 * 5}));

    const int64_t seq = 7;
    torch::Tensor x = torch::randn({1, seq, c.hidden_size}, torch::kFloat64);
    RopeTables rope = make_rope_tables(c.max_seq_len, c.qk_rope_head_dim, c.rope_theta, true);
    torch::Tensor got;
    {
      torch::NoGradGuard no_grad;
      got = mla(x, rope)[0];
    }
    torch::Tensor expected = direct_mla(c, w, x[0]);
    // RoPE tables are fp32: agreement to their rounding.
    EXPECT_LT((got - expected).abs().max().item<double>(), 1e-6) << "q_lora_rank " << q_lora_rank;
  }
}

// YaRN: the softmax scale is (qk_nope + qk_rope)^-0.5 × (0.1 mscale_all_dim ln(factor) + 1)².
TEST(MultiHeadLatentAttention, SoftmaxScaleCarriesTheYarnTemperature) {
  ModelConfig c = mla_config(0);
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(10.0));
  c.rope_scaling_factor = 40;
  c.rope_mscale_all_dim = 0.707;
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(c.softmax_scale(), m * m / std::sqrt(10.0));
}

TEST(MultiHeadLatentAttention, DeepSeekV3ShapedModelHasHuggingFaceNames) {
  ModelConfig c = mla_config(12);
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 8;
  c.num_experts_per_tok = 2;
  c.topk_method = TopkMethod::kNoauxTc;
  c.scoring_func = ScoringFunction::kSigmoid;
  c.first_k_dense_replace = 1;
  CausalLM model(c, LayerSlice::whole(c));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, p] : sorted_parameters(*model)) shapes[name] = p.sizes().vec();
  EXPECT_EQ(shapes["model.layers.0.mlp.gate_proj.weight"], (std::vector<int64_t>{32, 24}));  // dense first layer
  EXPECT_EQ(shapes["model.layers.1.mlp.gate.weight"], (std::vector<int64_t>{4, 24}));
  EXPECT_EQ(shapes["model.layers.1.mlp.gate.e_score_correction_bias"], (std::vector<int64_t>{4}));
  EXPECT_EQ(shapes["model.layers.1.mlp.experts.3.down_proj.weight"], (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(shapes["model.layers.1.mlp.shared_experts.up_proj.weight"], (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.q_a_layernorm.weight"], (std::vector<int64_t>{12}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.kv_a_layernorm.weight"], (std::vector<int64_t>{10}));
  EXPECT_EQ(shapes.count("model.layers.1.self_attn.q_proj.weight"), 0u);
  torch::Tensor ids = torch::randint(0, c.vocab_size, {2, 5}, torch::kInt64);
  EXPECT_EQ(model(ids).sizes(), (std::vector<int64_t>{2, 5, 40}));
}

// YaRN's rotary tables (DeepSeek-V2/V3 at 128K): at position 1 the sine of each pair's frequency,
// times the magnitude mscale(factor, 1) / mscale(factor, 0). With head dim 64, theta 1e4 and an
// original context of 4096, pairs 0-10 turn more than 32 times over it and keep their frequency,
// pairs from 23 on turn less than once and are divided by the factor, a linear ramp between.
TEST(MultiHeadLatentAttention, YarnTablesInterpolateOnlyTheSlowPairs) {
  const int64_t d = 64;
  const double theta = 10000, factor = 40;
  YarnScaling yarn;
  yarn.factor = factor;
  yarn.original_max_seq_len = 4096;
  RopeTables tables = make_rope_tables(8, d, theta, /*interleave=*/true, yarn);
  const double magnitude = 0.1 * std::log(factor) + 1.0;
  // low = floor(d ln(4096 / (32 · 2π)) / (2 ln θ)) = 10, high = ceil(d ln(4096 / 2π) / (2 ln θ)) = 23
  for (int64_t i = 0; i < d / 2; ++i) {
    const double base = std::pow(theta, -2.0 * i / d);
    const double ramp = std::min(1.0, std::max(0.0, (i - 10.0) / 13.0));
    const double expected = base * (1 - ramp) + base / factor * ramp;
    const double sine = tables.sin[1][2 * i + 1].item<double>();
    EXPECT_NEAR(std::asin(sine / magnitude) / expected, 1.0, 1e-5) << "pair " << i;
    EXPECT_NEAR(tables.cos[1][2 * i].item<double>(), magnitude * std::cos(expected), 1e-6) << "pair " << i;
  }
  // Without scaling: the plain tables.
  RopeTables plain = make_rope_tables(8, d, theta, true);
  EXPECT_NEAR(plain.sin[1][1].item<double>(), std::sin(1.0), 1e-7);
}
