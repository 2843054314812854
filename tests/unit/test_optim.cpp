#include <gtest/gtest.h>

#include <cmath>

#include "dstrain/optim/adamw.h"
#include "dstrain/optim/gradients.h"
#include "dstrain/optim/loss_scaler.h"
#include "dstrain/optim/lr_schedule.h"

using namespace dstrain;

namespace {

torch::Tensor no_inf() { return torch::zeros({}); }

}  // namespace

// AdamW on every element against the update written out in scalar arithmetic, with a gradient
// divisor (clipping's) on some steps.
TEST(AdamW, MatchesTheScalarFormulaOverSeveralSteps) {
  torch::manual_seed(34);  // reproducible inputs (the default generator starts at random)
  torch::Tensor matrix = torch::randn({3, 4}, torch::kFloat64).to(torch::kFloat32);
  torch::Tensor norm = torch::randn({4}, torch::kFloat64).to(torch::kFloat32);
  torch::Tensor matrix0 = matrix.clone(), norm0 = norm.clone();
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  AdamW adam(NamedTensors{{"w", matrix}, {"model.norm.weight", norm}}, o);
  std::vector<double> p(matrix0.data_ptr<float>(), matrix0.data_ptr<float>() + 12);
  std::vector<double> q(norm0.data_ptr<float>(), norm0.data_ptr<float>() + 4);
  std::vector<double> m(16, 0.0), v(16, 0.0);
  for (int t = 1; t <= 5; ++t) {
    const double lr = 0.01 * t;
    torch::Tensor gm = torch::randn({3, 4}), gn = torch::randn({4});
    const double divisor = t % 2 == 0 ? 3.5 : 1.0;
    if (t == 1)
      adam.step(lr, {gm, gn}, no_inf());
    else
      adam.step(lr, {gm, gn}, no_inf(), torch::full({}, divisor));
    for (int i = 0; i < 16; ++i) {
      bool is_matrix = i < 12;
      double& x = is_matrix ? p[i] : q[i - 12];
      double g = (is_matrix ? gm.data_ptr<float>()[i] : gn.data_ptr<float>()[i - 12]) / divisor;
      if (is_matrix) x *= 1 - lr * o.weight_decay;  // no decay for the 1-D norm weight
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      double mhat = m[i] / (1 - std::pow(o.beta1, t)), vhat = v[i] / (1 - std::pow(o.beta2, t));
      x -= lr * mhat / (std::sqrt(vhat) + o.eps);
    }
  }
  EXPECT_EQ(adam.step_count(), 5);
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(matrix.data_ptr<float>()[i], p[i], 1e-5);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(norm.data_ptr<float>()[i], q[i], 1e-5);
}

// A bf16 model trains on fp32 master weights: the masters follow exactly the fp32 optimizer's
// trajectory, and each bf16 parameter is its master rounded (updates smaller than bf16's
// spacing accumulate in the master instead of vanishing).
TEST(AdamW, Bf16ParametersFollowFp32MasterWeights) {
  torch::manual_seed(35);  // reproducible inputs (the default generator starts at random)
  torch::Tensor start = torch::randn({8, 8});
  torch::Tensor fp32 = start.clone(), bf16 = start.to(torch::kBFloat16);
  AdamW reference(NamedTensors{{"w", fp32}}, {}), mixed(NamedTensors{{"w", bf16}}, {});
  // The master starts from the bf16 parameter (as the model was rounded before the optimizer saw it).
  fp32.copy_(bf16.to(torch::kFloat32));
  for (int t = 0; t < 4; ++t) {
    torch::Tensor g = torch::randn({8, 8});
    reference.step(1e-4, {g}, no_inf());
    mixed.step(1e-4, {g}, no_inf());
  }
  const AdamW::State& state = mixed.states().front();
  EXPECT_EQ(state.master.scalar_type(), torch::kFloat32);
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(state.master, fp32));
  EXPECT_TRUE(torch::equal(bf16, fp32.to(torch::kBFloat16)));
  // 4 steps of lr 1e-4 move a weight by ~4e-4, under bf16's spacing for most values: the
  // master moved, and some parameters (those near a rounding boundary or small) too.
  EXPECT_FALSE(torch::equal(state.master, start.to(torch::kBFloat16).to(torch::kFloat32)));
}

TEST(AdamW, StepWithNonFiniteGradientsChangesNothing) {
  torch::manual_seed(36);  // reproducible inputs (the default generator starts at random)
  torch::Tensor w = torch::randn({4, 4});
  AdamW adam(NamedTensors{{"w", w}}, {});
  adam.step(0.1, {torch::randn({4, 4})}, no_inf());
  torch::Tensor before = w.clone(), exp_avg = adam.states()[0].exp_avg.clone();
  adam.step(0.1, {torch::full({4, 4}, std::nanf(""))}, torch::ones({}));
  EXPECT_TRUE(torch::equal(w, before));
  EXPECT_TRUE(torch::equal(adam.states()[0].exp_avg, exp_avg));
  EXPECT_EQ(adam.step_count(), 1);
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
  // Decay over no steps: the peak at the end of warmup, the floor right after it.
  LrSchedule no_decay{1.0, 0.1, 2, 2};
  EXPECT_DOUBLE_EQ(no_decay.at(2), 1.0);
  EXPECT_DOUBLE_EQ(no_decay.at(3), 0.1);
  EXPECT_DOUBLE_EQ(no_decay.at(100), 0.1);
}

// fp32 parameters accumulate into the buffer through autograd itself (.grad is a view of it).
TEST(GradientBuffer, Fp32ParametersAccumulateInPlace) {
  torch::Tensor w = torch::ones({2, 3}, torch::requires_grad()), b = torch::ones({3}, torch::requires_grad());
  NamedTensors params{{"b", b}, {"w", w}};
  GradientBuffer buffer(params, {w, b});
  for (int micro = 1; micro <= 3; ++micro) (w.sum() * micro + b.sum() * 10).backward();
  EXPECT_TRUE(torch::equal(buffer.grads()[0], torch::full({3}, 30.0f)));
  EXPECT_TRUE(torch::equal(buffer.grads()[1], torch::full({2, 3}, 6.0f)));
  EXPECT_EQ(buffer.flat().numel(), 9);
  EXPECT_TRUE(w.grad().data_ptr() == buffer.grads()[1].data_ptr());
  buffer.zero();
  EXPECT_EQ(buffer.flat().abs().sum().item<float>(), 0.0f);
  (w.sum() * 2).backward();
  EXPECT_TRUE(torch::equal(buffer.grads()[1], torch::full({2, 3}, 2.0f)));
}

// bf16 gradients are summed in fp32: 1 + 2^-9 is 1 in bf16 (spacing 2^-7 at 1) but not in fp32.
TEST(GradientBuffer, Bf16GradientsAreSummedInFp32) {
  torch::Tensor w = torch::ones({4}, torch::dtype(torch::kBFloat16).requires_grad(true));
  GradientBuffer buffer({{"w", w}}, {w});
  for (double scale : {1.0, std::ldexp(1.0, -9)}) {
    (w.sum() * scale).backward();
    EXPECT_FALSE(w.grad().defined());  // added to the buffer and freed as soon as autograd made it
  }
  buffer.reduce();
  EXPECT_EQ(buffer.grads()[0].scalar_type(), torch::kFloat32);
  EXPECT_FLOAT_EQ(buffer.grads()[0][0].item<float>(), 1.0f + std::ldexp(1.0f, -9));
  torch::Tensor bf16_sum = torch::ones({}, torch::kBFloat16) + torch::full({}, std::ldexp(1.0, -9), torch::kBFloat16);
  EXPECT_EQ(bf16_sum.item<float>(), 1.0f);  // what accumulating in bf16 would have given
}

// A new step starts from zero, also for a parameter that the step's first micro-batch does not
// use, and for one that the whole step does not use (the buffer is read after reduce()).
TEST(GradientBuffer, EachStepStartsFromZero) {
  torch::Tensor used = torch::ones({2}, torch::dtype(torch::kBFloat16).requires_grad(true));
  torch::Tensor sometimes = torch::ones({2}, torch::dtype(torch::kBFloat16).requires_grad(true));
  GradientBuffer buffer({{"sometimes", sometimes}, {"used", used}}, {used, sometimes});
  (used.sum() * 3 + sometimes.sum() * 5).backward();
  buffer.reduce();
  EXPECT_EQ(buffer.grads()[0][0].item<float>(), 5.0f);
  buffer.zero();
  (used.sum() * 2).backward();  // `sometimes` unused in the step's first micro-batch
  (used.sum() + sometimes.sum() * 7).backward();
  buffer.reduce();
  EXPECT_EQ(buffer.grads()[0][0].item<float>(), 7.0f);
  EXPECT_EQ(buffer.grads()[1][0].item<float>(), 3.0f);
  buffer.zero();
  (used.sum() * 4).backward();  // `sometimes` unused all step: zero, not the last step's 7
  buffer.reduce();
  EXPECT_EQ(buffer.grads()[0][0].item<float>(), 0.0f);
  EXPECT_EQ(buffer.grads()[1][0].item<float>(), 4.0f);
}

TEST(Gradients, GlobalNormAndClipping) {
  torch::Tensor a = torch::zeros({2}, torch::requires_grad());
  torch::Tensor b = torch::zeros({1}, torch::requires_grad());
  GradientBuffer buffer({{"a", a}, {"b", b}}, {a, b});
  buffer.grads()[0].copy_(torch::tensor({3.0f, 0.0f}));
  buffer.grads()[1].copy_(torch::tensor({4.0f}));
  torch::Tensor norm = global_grad_norm(buffer, nullptr);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_FLOAT_EQ(norm.item<float>(), 5.0f);
  EXPECT_EQ(clip_divisor(norm, 10.0).item<float>(), 1.0f);  // under the limit: unchanged
  EXPECT_EQ(clip_divisor(norm, 0.0).item<float>(), 1.0f);   // no clipping
  // Over it: the divided gradients have norm max_norm, as clip_grad_norm_ leaves them.
  torch::Tensor divisor = clip_divisor(norm, 1.0);
  EXPECT_EQ(divisor.dim(), 0);
  EXPECT_NEAR((buffer.flat() / divisor).norm().item<float>(), 1.0, 1e-5);
  EXPECT_NEAR((a.grad()[0] / divisor).item<float>(), 0.6, 1e-5);
}

// An injected overflow: the step is counted as skipped and the scale backs off; clean steps
// grow it again after the growth interval.
TEST(DynamicLossScaler, BacksOffOnOverflowAndGrowsAfterCleanSteps) {
  DynamicLossScaler scaler(1024.0, /*growth_interval=*/3, torch::kCPU);
  EXPECT_EQ(scaler.scale().item<float>(), 1024.0f);
  scaler.update(torch::ones({}));  // overflow
  EXPECT_EQ(scaler.scale().item<float>(), 512.0f);
  EXPECT_EQ(scaler.skipped_steps().item<float>(), 1.0f);
  scaler.update(torch::zeros({}));
  scaler.update(torch::zeros({}));
  EXPECT_EQ(scaler.scale().item<float>(), 512.0f);  // two clean steps: not yet
  scaler.update(torch::zeros({}));
  EXPECT_EQ(scaler.scale().item<float>(), 1024.0f);  // the third
  scaler.update(torch::zeros({}));
  scaler.update(torch::ones({}));  // the count restarts after an overflow
  scaler.update(torch::zeros({}));
  scaler.update(torch::zeros({}));
  EXPECT_EQ(scaler.scale().item<float>(), 512.0f);
  EXPECT_EQ(scaler.skipped_steps().item<float>(), 2.0f);
}

// The whole fp16 path on an injected inf: scaled loss, unscaled gradients, skipped update.
TEST(DynamicLossScaler, InjectedInfSkipsTheUpdateAndHalvesTheScale) {
  torch::Tensor w = torch::ones({3}, torch::dtype(torch::kFloat16).requires_grad(true));
  GradientBuffer buffer({{"w", w}}, {w});
  AdamW adam(NamedTensors{{"w", w}}, {});
  DynamicLossScaler scaler(256.0, 1000, torch::kCPU);
  auto step = [&](const torch::Tensor& injected) {
    buffer.zero();
    ((w.to(torch::kFloat32) * injected).sum() * scaler.scale()).backward();
    buffer.flat().div_(scaler.scale());
    torch::Tensor found_inf = global_grad_norm(buffer, nullptr).isfinite().logical_not().to(torch::kFloat32);
    adam.step(0.1, buffer.grads(), found_inf);
    scaler.update(found_inf);
  };
  step(torch::tensor({1.0f, 2.0f, 3.0f}));
  EXPECT_FLOAT_EQ(buffer.grads()[0][2].item<float>(), 3.0f);  // unscaled again
  torch::Tensor after_first = w.clone();
  step(torch::tensor({1.0f, std::numeric_limits<float>::infinity(), 3.0f}));
  EXPECT_TRUE(torch::equal(w, after_first));
  EXPECT_EQ(adam.step_count(), 1);
  EXPECT_EQ(scaler.scale().item<float>(), 128.0f);
  EXPECT_EQ(scaler.skipped_steps().item<float>(), 1.0f);
}
