#include <gtest/gtest.h>

#include <cmath>

#include "dstrain/optim/adamw.h"
#include "dstrain/optim/gradients.h"
#include "dstrain/optim/lr_schedule.h"

using namespace dstrain;

// AdamW on every element against the update written out in scalar arithmetic.
TEST(AdamW, MatchesTheScalarFormulaOverSeveralSteps) {
  torch::Tensor matrix = torch::randn({3, 4}, torch::kFloat64).to(torch::kFloat32);
  torch::Tensor norm = torch::randn({4}, torch::kFloat64).to(torch::kFloat32);
  torch::Tensor matrix0 = matrix.clone(), norm0 = norm.clone();
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  AdamW adam({{"w", matrix}, {"model.norm.weight", norm}}, o);
  std::vector<double> p(matrix0.data_ptr<float>(), matrix0.data_ptr<float>() + 12);
  std::vector<double> q(norm0.data_ptr<float>(), norm0.data_ptr<float>() + 4);
  std::vector<double> m(16, 0.0), v(16, 0.0);
  for (int t = 1; t <= 5; ++t) {
    const double lr = 0.01 * t;
    torch::Tensor gm = torch::randn({3, 4}), gn = torch::randn({4});
    matrix.mutable_grad() = gm;
    norm.mutable_grad() = gn;
    adam.step(lr);
    for (int i = 0; i < 16; ++i) {
      bool is_matrix = i < 12;
      double& x = is_matrix ? p[i] : q[i - 12];
      double g = is_matrix ? gm.data_ptr<float>()[i] : gn.data_ptr<float>()[i - 12];
      if (is_matrix) x *= 1 - lr * o.weight_decay;  // no decay for the 1-D norm weight
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      double mhat = m[i] / (1 - std::pow(o.beta1, t)), vhat = v[i] / (1 - std::pow(o.beta2, t));
      x -= lr * mhat / (std::sqrt(vhat) + o.eps);
    }
  }
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(matrix.data_ptr<float>()[i], p[i], 1e-5);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(norm.data_ptr<float>()[i], q[i], 1e-5);
}

TEST(LrSchedule, WarmupThenCosineThenFloor) {
  LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.at(5), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
  LrSchedule no_warmup{2.0, 0.0, 0, 4};
  EXPECT_NEAR(no_warmup.at(1), 1.0 + std::cos(M_PI * 0.25), 1e-12);
}

TEST(Gradients, GlobalNormAndClipping) {
  torch::Tensor a = torch::zeros({2}, torch::requires_grad());
  torch::Tensor b = torch::zeros({1}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  NamedTensors params{{"a", a}, {"b", b}};
  double norm = global_grad_norm(params, nullptr);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  clip_gradients(params, norm, 10.0);  // under the limit: unchanged
  EXPECT_FLOAT_EQ(b.grad().item<float>(), 4.0f);
  clip_gradients(params, norm, 1.0);
  EXPECT_NEAR(global_grad_norm(params, nullptr), 1.0, 1e-5);
  EXPECT_NEAR(a.grad()[0].item<float>(), 0.6, 1e-5);
}
