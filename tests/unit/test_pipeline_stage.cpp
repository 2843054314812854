// The pipeline executor drives any PipelineStage, not only a language model: a toy stage with
// losses of its own names. Its sums, the gradient of its objective and the factor handed to the
// stage for losses added inside its layers are checked against the same computed directly.
#include <gtest/gtest.h>

#include <stdexcept>

#include "dstrain/pipeline/executor.h"
#include "unused_communicator.h"

using namespace dstrain;

namespace {

// One rank, no peers: a schedule with one stage never calls these.
class NoPeers : public test::UnusedCommunicator {
 public:
  NoPeers() : UnusedCommunicator("a one-stage schedule communicated") {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Backend backend() const override { return Backend::kMpi; }
  bool callable_from_any_thread() const override { return true; }
  void exchange(std::vector<Transfer>& transfers) override {
    if (!transfers.empty()) unused();
  }
  void barrier() override {}
  void synchronize() override {}
};

// tokens [B, S + 1] → "fit": mean (Σw · x - next)², "size": mean w²; objective fit + 0.1 size.
class ToyStage : public PipelineStage {
 public:
  torch::Tensor w = torch::tensor({0.5f, -0.25f, 2.0f}).requires_grad_(true);
  torch::Tensor factor;
  bool training = false;
  int passes = 0;

  int chunks() const override { return 1; }
  int64_t activation_width() const override { return 3; }
  std::vector<std::string> loss_names() const override { return {"fit", "size"}; }
  void begin_pass(bool train, const torch::Tensor& loss_gradient_factor) override {
    training = train;
    factor = loss_gradient_factor;
    ++passes;
  }
  torch::Tensor forward(int, const torch::Tensor&) override { throw std::logic_error("one stage: losses only"); }
  MicroBatchLosses losses(int, const torch::Tensor& input, const torch::Tensor& tokens) override {
    const torch::Tensor x = input.to(torch::kFloat32);
    const torch::Tensor next = tokens.narrow(1, 1, input.size(1)).to(torch::kFloat32);
    const torch::Tensor fit = (x * w.sum() - next).pow(2).mean();
    const torch::Tensor size = w.pow(2).mean();
    return {fit + 0.1 * size, {fit, size}};
  }
};

}  // namespace

TEST(PipelineStage, ExecutorSumsNamedLossesAndScalesTheBackwardPass) {
  ToyStage stage;
  NoPeers peers;
  const int micro_batches = 3;
  WeightGradientStore weight_gradients;
  PipelineExecutor executor(make_schedule(ScheduleKind::kOneFOneB, 1, 1, micro_batches),
                            make_schedule(ScheduleKind::kForwardOnly, 1, 1, micro_batches), 0, stage, weight_gradients,
                            peers, ActivationShape{2, 4, torch::kFloat32, torch::kCPU});
  std::vector<torch::Tensor> batches;
  for (int i = 0; i < micro_batches; ++i) batches.push_back(torch::randint(0, 9, {2, 5}, torch::kInt64));
  const double divisor = micro_batches;
  const torch::Tensor scale = torch::full({}, 8.0f);
  const std::vector<torch::Tensor> sums =
      executor.train_step([&](int i) { return batches[static_cast<size_t>(i)]; }, divisor, scale);
  EXPECT_TRUE(stage.training);
  ASSERT_TRUE(stage.factor.defined());
  EXPECT_FLOAT_EQ(stage.factor.item<float>(), 8.0f / 3.0f);  // loss scale / micro-batches

  // The same by hand: each micro-batch's objective / divisor × scale, backward into w.
  const torch::Tensor w = torch::tensor({0.5f, -0.25f, 2.0f}).requires_grad_(true);
  double fit_sum = 0, size_sum = 0;
  for (const torch::Tensor& tokens : batches) {
    const torch::Tensor x = tokens.narrow(1, 0, 4).to(torch::kFloat32), next = tokens.narrow(1, 1, 4).to(torch::kFloat32);
    const torch::Tensor fit = (x * w.sum() - next).pow(2).mean(), size = w.pow(2).mean();
    fit_sum += fit.item<double>() / divisor;
    size_sum += size.item<double>() / divisor;
    ((fit + 0.1 * size) / divisor * 8.0).backward();
  }
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_NEAR(sums[0].item<double>(), fit_sum, 1e-5 * std::abs(fit_sum));
  EXPECT_NEAR(sums[1].item<double>(), size_sum, 1e-6);
  ASSERT_TRUE(stage.w.grad().defined());
  EXPECT_TRUE(torch::allclose(stage.w.grad(), w.grad(), 1e-5, 1e-5)) << stage.w.grad() << w.grad();

  // Evaluation: no gradient, the first loss only, summed over micro-batches in fp64.
  const torch::Tensor evaluated = executor.evaluate([&](int i) { return batches[static_cast<size_t>(i)]; });
  EXPECT_FALSE(stage.training);
  EXPECT_EQ(evaluated.scalar_type(), torch::kFloat64);
  EXPECT_NEAR(evaluated.item<double>(), fit_sum * divisor, 1e-5 * std::abs(fit_sum * divisor));
  EXPECT_EQ(stage.passes, 2);
}
