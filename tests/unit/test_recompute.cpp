// The recomputation function (model/recompute.h) against the same part run once: bitwise equal
// gradients of the input and the parameters, the rerun told it is one, and MoE's per-pass counts
// made once per forward pass; and unfused attention under selective recomputation keeping no
// probabilities.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "dstrain/core/step_memory.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/model/causal_attention.h"
#include "dstrain/model/moe.h"
#include "dstrain/model/recompute.h"

using namespace dstrain;

namespace {

// Two linear maps with a nonlinearity: a part with parameters and an input used twice.
struct Part {
  torch::nn::Linear first{torch::nn::LinearOptions(6, 8).bias(false)};
  torch::nn::Linear second{torch::nn::LinearOptions(8, 6).bias(false)};
  std::vector<Pass> passes;  // the pass of each run
  torch::Tensor operator()(const torch::Tensor& x, Pass pass = Pass::kFirst) {
    passes.push_back(pass);
    return x + second(torch::tanh(first(x)));
  }
};

}  // namespace

TEST(Recompute, GradientsEqualThoseOfThePartRunOnce) {
  torch::manual_seed(3);
  Part part;
  const torch::Tensor source = torch::randn({4, 5, 6});
  const torch::Tensor upstream = torch::randn({4, 5, 6});

  torch::Tensor x = source.clone().requires_grad_(true);
  part(x).backward(upstream);
  const torch::Tensor x_grad = x.grad().clone(), w_grad = part.first->weight.grad().clone();
  part.first->weight.mutable_grad().reset();
  part.second->weight.mutable_grad().reset();

  torch::Tensor y = source.clone().requires_grad_(true);
  torch::Tensor out = recompute_in_backward([&](const torch::Tensor& in, Pass pass) { return part(in, pass); }, y);
  out.backward(upstream);
  EXPECT_TRUE(torch::equal(y.grad(), x_grad));
  EXPECT_TRUE(torch::equal(part.first->weight.grad(), w_grad));
  // Run once plainly, once as the first pass, once as the rerun.
  EXPECT_EQ(part.passes, (std::vector<Pass>{Pass::kFirst, Pass::kFirst, Pass::kRerun}));
}

TEST(Recompute, WithoutGradientsThePartJustRuns) {
  Part part;
  const torch::Tensor x = torch::randn({2, 3, 6});
  {
    torch::NoGradGuard no_grad;  // evaluation
    EXPECT_TRUE(torch::equal(
        recompute_in_backward([&](const torch::Tensor& in, Pass pass) { return part(in, pass); }, x), part(x)));
  }
  // An input that needs no gradient: the parameters still get theirs.
  recompute_in_backward([&](const torch::Tensor& in, Pass pass) { return part(in, pass); }, x).sum().backward();
  ASSERT_TRUE(part.first->weight.grad().defined());
  EXPECT_GT(part.first->weight.grad().abs().sum().item<double>(), 0.0);
}

TEST(Recompute, MoECountsExpertLoadsOncePerForwardPass) {
  ModelConfig c;
  c.hidden_size = 8;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 4;
  c.n_shared_experts = 1;
  c.scoring_func = dstrain::ScoringFunction::kSigmoid;
  c.topk_method = dstrain::TopkMethod::kNoauxTc;
  c.aux_loss_alpha = 0.01;
  torch::manual_seed(5);
  MoE plain(c), rerun(c);
  {
    // (The module leaves its weights to the model's initialisation: uninitialised memory, NaN at times.)
    torch::NoGradGuard no_grad;
    for (auto& item : plain->named_parameters()) {
      if (item.value().requires_grad()) item.value().normal_(0.0, 0.5);
      rerun->named_parameters()[item.key()].copy_(item.value());
    }
  }
  const torch::Tensor x = torch::randn({2, 5, 8});
  torch::Tensor a = x.clone().requires_grad_(true), b = x.clone().requires_grad_(true);
  plain(a).sum().backward();
  recompute_in_backward([&](const torch::Tensor& in, Pass pass) { return rerun(in, pass); }, b).sum().backward();
  EXPECT_TRUE(torch::equal(plain->expert_load(), rerun->expert_load()));
  EXPECT_EQ(plain->expert_load().sum().item<double>(), 2 * 5 * 2);  // tokens × experts per token
  EXPECT_TRUE(torch::equal(plain->balance_loss(), rerun->balance_loss()));
  EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
}

// recompute_outputs: the part's outputs give their memory back once the consumer has run, get it
// again (with the same values) before the consumer's backward pass, and every gradient is the
// same bits as running part and consumer plainly.
TEST(Recompute, DroppedOutputsComeBackBeforeTheirConsumersBackwardPass) {
  torch::manual_seed(5);
  Part part;
  torch::nn::Linear consumer_weights(torch::nn::LinearOptions(6, 3).bias(false));
  const torch::Tensor source = torch::randn({4, 5, 6});
  const torch::Tensor upstream = torch::randn({4, 5, 3});

  torch::Tensor x = source.clone().requires_grad_(true);
  consumer_weights(part(x)).backward(upstream);
  const torch::Tensor x_grad = x.grad().clone(), w_grad = part.first->weight.grad().clone(),
                      c_grad = consumer_weights->weight.grad().clone();
  for (torch::Tensor* grad : {&part.first->weight.mutable_grad(), &part.second->weight.mutable_grad(),
                              &consumer_weights->weight.mutable_grad()})
    grad->reset();

  torch::Tensor y = source.clone().requires_grad_(true);
  torch::Tensor kept_by_consumer;
  std::vector<size_t> bytes_seen_in_backward;
  const Tensors out = recompute_outputs([&](const Tensors& in) { return Tensors{part(in[0])}; }, {y},
                                        [&](const Tensors& dropped) {
                                          kept_by_consumer = dropped[0].detach();
                                          return Tensors{consumer_weights(dropped[0])};
                                        });
  EXPECT_EQ(kept_by_consumer.storage().nbytes(), 0u) << "the part's output kept its memory";
  out[0].register_hook([&](const torch::Tensor& grad) {
    bytes_seen_in_backward.push_back(kept_by_consumer.storage().nbytes());
    return grad;
  });
  out[0].backward(upstream);
  EXPECT_TRUE(torch::equal(y.grad(), x_grad));
  EXPECT_TRUE(torch::equal(part.first->weight.grad(), w_grad));
  EXPECT_TRUE(torch::equal(consumer_weights->weight.grad(), c_grad));
  ASSERT_EQ(bytes_seen_in_backward.size(), 1u);
  EXPECT_EQ(bytes_seen_in_backward[0], 0u);  // the hook runs before the restoring node
  EXPECT_EQ(kept_by_consumer.storage().nbytes(), static_cast<size_t>(4 * 5 * 6 * 4));  // refilled
  EXPECT_TRUE(torch::equal(kept_by_consumer, part(source)));
}

// The refilled outputs and the kept inputs are given back as soon as their consumer's and their
// part's backward passes have run, not when the graph goes: the graph goes when the whole backward
// pass has run, so that by then every dropped output of the model would be back in memory at once.
TEST(Recompute, DroppedOutputsAreGivenBackWithTheirBackwardPassNotWithTheGraph) {
  torch::manual_seed(6);
  Part part;
  torch::nn::Linear consumer_weights(torch::nn::LinearOptions(6, 6).bias(false));
  torch::Tensor x = torch::randn({4, 5, 6}).requires_grad_(true);
  std::vector<torch::Tensor> refilled, inputs;  // (the test's own references: one use each)
  torch::Tensor h = x;
  for (int block = 0; block < 3; ++block) {
    inputs.push_back(h.detach());
    h = recompute_outputs([&](const Tensors& in) { return Tensors{part(in[0])}; }, {h},
                          [&](const Tensors& dropped) {
                            refilled.push_back(dropped[0].detach());
                            return Tensors{consumer_weights(dropped[0])};
                          })[0];
  }
  const c10::StorageImpl* first_input = inputs[1].storage().unsafeGetStorageImpl();
  const long input_uses = inputs[1].storage().use_count();
  h.sum().backward();  // h, and with it the whole graph, lives on
  for (const torch::Tensor& output : refilled) {
    EXPECT_EQ(output.storage().nbytes(), static_cast<size_t>(4 * 5 * 6 * 4)) << "not refilled";
    EXPECT_EQ(output.storage().use_count(), 1) << "a refilled output outlived its consumer's backward pass";
  }
  ASSERT_EQ(inputs[1].storage().unsafeGetStorageImpl(), first_input);
  EXPECT_LT(inputs[1].storage().use_count(), input_uses) << "a part's input outlived its backward pass";
}

// A RerunClock counts the reruns of both functions (recompute_outputs' refill inside its rerun's
// time, not as a rerun of its own), and nothing of the first forward pass or of a backward pass
// without recomputation: parts that sleep and time their own sleep, whose time the clock's must
// hold (however long a loaded machine oversleeps), and the count of reruns says that none was
// counted twice.
TEST(Recompute, RerunClockCountsTheRerunsOnly) {
  using Clock = std::chrono::steady_clock;
  auto sleeping = [](double* slept) {
    return [slept](const torch::Tensor& in, Pass = Pass::kFirst) {
      const Clock::time_point start = Clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      *slept = std::chrono::duration<double>(Clock::now() - start).count();  // this run's
      return in * 2;
    };
  };
  double plain_slept = 0, whole_slept = 0, dropped_slept = 0;
  const torch::Tensor x = torch::randn({3}).requires_grad_(true);
  RerunClock clock;
  torch::Tensor plain = sleeping(&plain_slept)(x).sum();
  torch::Tensor whole = recompute_in_backward(sleeping(&whole_slept), x, &clock).sum();
  const Tensors dropped = recompute_outputs([&](const Tensors& in) { return Tensors{sleeping(&dropped_slept)(in[0])}; },
                                            {x}, [](const Tensors& out) { return Tensors{out[0] * out[0]}; }, &clock);
  plain.backward();
  EXPECT_EQ(clock.seconds(), 0.0) << "a forward pass or a plain backward pass counted";
  EXPECT_EQ(clock.reruns(), 0);
  whole.backward();
  EXPECT_GE(clock.seconds(), whole_slept);
  EXPECT_EQ(clock.reruns(), 1);
  const double before = clock.seconds();
  dropped[0].sum().backward();
  EXPECT_GE(clock.seconds() - before, dropped_slept);
  EXPECT_EQ(clock.reruns(), 2) << "the refill inside the rerun counted as a rerun of its own";
}

// Unfused attention under selective recomputation: through a chain of attentions (a layer's
// output the next one's queries, keys and values), the forward pass's memory does not grow by one
// probability matrix a layer as it does without it, and the gradients are bitwise the same.
TEST(Recompute, SelectiveAttentionKeepsNoProbabilitiesAndGivesTheSameGradients) {
  if (compat::kHasFusedAttention) GTEST_SKIP() << "fused attention keeps no probabilities with or without it";
  torch::manual_seed(8);
  const int64_t layers = 6, batch = 2, heads = 3, seq = 128, head_dim = 4;  // probabilities dominate
  const torch::Tensor source = torch::randn({batch, heads, seq, head_dim});
  const torch::Tensor upstream = torch::randn({batch, heads, seq, head_dim});
  const int64_t probabilities_bytes = batch * heads * seq * seq * 4;
  struct Run {
    torch::Tensor grad;
    int64_t forward_peak;
  };
  auto run = [&](bool selective) {
    torch::Tensor x = source.clone().requires_grad_(true), h = x;
    accel::StepMemoryMeter meter(torch::kCPU);
    meter.begin_step();
    for (int64_t layer = 0; layer < layers; ++layer)
      h = causal_attention(h, h * 0.5, h + 1.0, 0.3, SelectiveRecompute{selective, nullptr});
    meter.end_step();
    h.backward(upstream);
    return Run{x.grad(), meter.peak_bytes()};
  };
  const Run kept = run(false), dropped = run(true);
  EXPECT_TRUE(torch::equal(dropped.grad, kept.grad));
  EXPECT_GE(kept.forward_peak, layers * probabilities_bytes);
  // The queries, keys and values of all layers stay (under one probability matrix together), and
  // a layer's scores and probabilities are alive while it runs.
  EXPECT_LT(dropped.forward_peak, 4 * probabilities_bytes) << "the probabilities were kept";
}
