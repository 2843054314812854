// The backward pass split in two (pipeline/weight_gradient_store.h, model/projection.h): B then W gives
// bitwise the gradients of one backward pass, B leaves the weights untouched, W reaches them
// through their gradient accumulators (where the data-parallel buckets listen), and without a
// deferral nothing changes.
#include <gtest/gtest.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "dstrain/core/error.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/pipeline/weight_gradient_store.h"
#include "dstrain/model/projection.h"
#include "dstrain/model/recompute.h"
#include "arrival_counter.h"

using namespace dstrain;

namespace {

// Two projections with a nonlinearity and a residual, the first also used twice; their weight
// gradients deferred to `deferral` (nullptr: never).
struct Chain {
  Projection first, second;
  explicit Chain(WeightGradientDeferral* deferral = nullptr) : first(6, 8, deferral), second(8, 6, deferral) {
    torch::NoGradGuard no_grad;
    first->weight.normal_();
    second->weight.normal_();
  }
  torch::Tensor operator()(const torch::Tensor& x) {
    return x + second(torch::tanh(first(x))) + second(torch::sigmoid(first(x)));
  }
  std::vector<torch::Tensor> weights() const { return {first->weight, second->weight}; }
};

void reset(const Chain& chain) {
  for (torch::Tensor w : chain.weights()) w.mutable_grad().reset();
}

void expect_bitwise(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  EXPECT_TRUE(torch::equal(a, b)) << what << ": largest difference " << (a - b).abs().max().item<double>();
}

}  // namespace

TEST(WeightGradientStore, BackwardSplitInTwoGivesTheGradientsOfOnePass) {
  torch::manual_seed(5);
  WeightGradientStore store;
  Chain chain(&store);
  const torch::Tensor source = torch::randn({3, 5, 6}), upstream = torch::randn({3, 5, 6});

  torch::Tensor x = source.clone().requires_grad_(true);
  chain(x).backward(upstream);
  const torch::Tensor x_grad = x.grad().clone();
  const torch::Tensor first_grad = chain.first->weight.grad().clone(), second_grad = chain.second->weight.grad().clone();
  reset(chain);

  int arrivals = 0;
  std::vector<dstrain::compat::GradAccumulatorPtr> accumulators;
  for (const torch::Tensor& w : chain.weights()) {
    accumulators.push_back(torch::autograd::impl::grad_accumulator(w));
    accumulators.back()->add_post_hook(std::make_unique<test::ArrivalCounter>(&arrivals));
  }
  torch::Tensor y = source.clone().requires_grad_(true);
  torch::Tensor out;
  {
    WeightGradientStore::Deferral deferral(store);
    out = chain(y);
  }
  store.collect({0, 0}, [&] { out.backward(upstream); });
  expect_bitwise(y.grad(), x_grad, "input gradient after B");
  EXPECT_FALSE(chain.first->weight.grad().defined());
  EXPECT_FALSE(chain.second->weight.grad().defined());
  EXPECT_EQ(arrivals, 0) << "B reached a weight's accumulator";
  EXPECT_FALSE(store.empty());

  store.compute({0, 0});
  EXPECT_TRUE(store.empty());
  expect_bitwise(chain.first->weight.grad(), first_grad, "first weight after W");
  expect_bitwise(chain.second->weight.grad(), second_grad, "second weight after W");
  EXPECT_EQ(arrivals, 2) << "one arrival per weight, though each is used twice";
}

// Two micro-batches: their W actions in either order accumulate what two backward passes do.
TEST(WeightGradientStore, KeepsEachBackwardPassApart) {
  torch::manual_seed(6);
  WeightGradientStore store;
  Chain chain(&store);
  const torch::Tensor a = torch::randn({2, 4, 6}), b = torch::randn({2, 4, 6});
  chain(a).sum().backward();
  chain(b).sum().backward();
  const torch::Tensor both = chain.first->weight.grad().clone();
  reset(chain);

  torch::Tensor out_a, out_b;
  {
    WeightGradientStore::Deferral deferral(store);
    out_a = chain(a.clone().requires_grad_(true));
    out_b = chain(b.clone().requires_grad_(true));
  }
  store.collect({0, 0}, [&] { out_a.sum().backward(); });
  store.collect({1, 0}, [&] { out_b.sum().backward(); });
  store.compute({0, 0});
  store.compute({1, 0});
  expect_bitwise(chain.first->weight.grad(), both, "two micro-batches");
}

// Deferred products inside a recomputed part land in the same store.
TEST(WeightGradientStore, WorksUnderRecomputation) {
  torch::manual_seed(7);
  WeightGradientStore store;
  Chain chain(&store);
  const torch::Tensor source = torch::randn({2, 3, 6});
  torch::Tensor x = source.clone().requires_grad_(true);
  chain(x).sum().backward();
  const torch::Tensor expected = chain.second->weight.grad().clone(), x_grad = x.grad().clone();
  reset(chain);

  torch::Tensor y = source.clone().requires_grad_(true);
  // On for the rerun too, which is a forward pass inside the backward pass.
  WeightGradientStore::Deferral deferral(store);
  torch::Tensor out = recompute_in_backward([&](const torch::Tensor& in, Pass) { return chain(in); }, y);
  store.collect({0, 0}, [&] { out.sum().backward(); });
  EXPECT_FALSE(chain.second->weight.grad().defined());
  store.compute({0, 0});
  expect_bitwise(chain.second->weight.grad(), expected, "second weight");
  expect_bitwise(y.grad(), x_grad, "input");
}

TEST(WeightGradientStore, WithoutDeferralProjectionsAreLinearMaps) {
  torch::manual_seed(8);
  WeightGradientStore store;
  Chain chain(&store);
  torch::nn::Linear reference(torch::nn::LinearOptions(6, 8).bias(false));
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(chain.first->weight);
  }
  const torch::Tensor x = torch::randn({4, 6});
  expect_bitwise(chain.first(x), reference(x), "forward");
  EXPECT_EQ(chain.first->named_parameters().keys(), std::vector<std::string>{"weight"});
  // A backward pass of a deferred product outside a B action is a bug, said as one.
  torch::Tensor out;
  {
    WeightGradientStore::Deferral deferral(store);
    out = chain.first(x.clone().requires_grad_(true)).sum();
  }
  try {
    out.backward();
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("outside the B action"), std::string::npos) << e.what();
  }
}
