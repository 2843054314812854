// The gradient buffer's data-parallel average on real MPI ranks: bucketed and started during the
// backward pass, it equals the plain average computed independently; sharded (ZeRO-1), the
// optimizer's update equals the unsharded one.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/optim/block_quantization.h"
#include "dstrain/optim/grad_buffer.h"

using namespace dstrain;

namespace {

// A small stack of matrices used in order, as a model's layers are: backward finishes them in
// reverse, which is the buffer's order.
struct Stack {
  std::vector<torch::Tensor> weights;
  NamedTensors named;
  explicit Stack(torch::ScalarType dtype) {
    for (int i = 0; i < 6; ++i) {
      torch::Tensor w = (torch::randn({16, 16}, torch::kFloat64) * 0.3).to(dtype).set_requires_grad(true);
      weights.push_back(w);
      named.emplace_back("layer." + std::to_string(i), w);
    }
  }
  torch::Tensor loss(const torch::Tensor& x) const {
    torch::Tensor h = x;
    for (const torch::Tensor& w : weights) h = torch::tanh(h.matmul(w.to(torch::kFloat32)));
    return h.pow(2).sum();
  }
};

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Each rank's micro-batches: different inputs on every rank.
torch::Tensor inputs(int rank, int micro) {
  torch::manual_seed(1000 * rank + micro);
  return torch::randn({4, 16});
}

}  // namespace

TEST(GradientBuffer, BucketedOverlappedAverageEqualsThePlainOne) {
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(7);  // the same weights on every rank
    Stack model(dtype);
    MpiCommunicator dp(MPI_COMM_WORLD);
    const int microbatches = 3;
    // About two matrices per bucket, each started as soon as its gradients are in.
    GradientBuffer buffer(model.named, model.weights, {&dp, torch::kFloat32, 2 * 16 * 16 * 4, true, microbatches});
    EXPECT_EQ(buffer.buckets(), 3u);
    buffer.zero();
    for (int micro = 0; micro < microbatches; ++micro) model.loss(inputs(dp.rank(), micro)).backward();
    buffer.reduce();

    // Independently: this rank's summed gradients, by plain autograd in fp32, averaged with MPI.
    torch::manual_seed(7);
    Stack reference(torch::kFloat32);
    if (dtype != torch::kFloat32)
      for (size_t i = 0; i < reference.weights.size(); ++i) {
        torch::NoGradGuard no_grad;
        reference.weights[i].copy_(model.weights[i].to(torch::kFloat32));
      }
    for (int micro = 0; micro < microbatches; ++micro) reference.loss(inputs(dp.rank(), micro)).backward();
    for (size_t i = 0; i < reference.weights.size(); ++i) {
      torch::Tensor expected = reference.weights[i].grad().clone();
      MPI_Allreduce(MPI_IN_PLACE, expected.data_ptr<float>(), static_cast<int>(expected.numel()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      expected /= dp.size();
      // bf16 weights give bf16 gradients before they are summed in fp32: within bf16's rounding.
      const double tolerance = dtype == torch::kFloat32 ? 1e-6 : 2e-2;
      EXPECT_LT((buffer.grads()[i] - expected).abs().max().item<double>(), tolerance * (1 + expected.abs().max().item<double>()))
          << "layer " << i << " " << c10::toString(dtype) << " on rank " << world_rank();
    }
  }
}

// Without overlap, one bucket, or bf16 on the wire: the same average (bitwise between the fp32
// variants with two ranks, where a sum does not depend on its order).
TEST(GradientBuffer, EveryWayOfReducingGivesTheSameAverage) {
  MpiCommunicator dp(MPI_COMM_WORLD);
  auto run = [&](int64_t bucket_bytes, bool overlap, torch::ScalarType wire) {
    torch::manual_seed(7);
    Stack model(torch::kFloat32);
    GradientBuffer buffer(model.named, model.weights, {&dp, wire, bucket_bytes, overlap, 2});
    buffer.zero();
    for (int micro = 0; micro < 2; ++micro) model.loss(inputs(dp.rank(), micro)).backward();
    buffer.reduce();
    return buffer.flat().clone();
  };
  torch::Tensor plain = run(int64_t{1} << 30, false, torch::kFloat32);
  torch::Tensor bucketed = run(1024, true, torch::kFloat32);
  torch::Tensor sixteen_bits = run(1024, true, torch::kBFloat16);
  if (dp.size() == 2)
    EXPECT_TRUE(torch::equal(plain, bucketed));
  else
    EXPECT_TRUE(torch::allclose(plain, bucketed, 1e-6, 1e-7));
  if (dp.size() == 1) {  // one rank sends nothing, so nothing is rounded to bf16
    EXPECT_TRUE(torch::equal(plain, sixteen_bits));
    return;
  }
  EXPECT_FALSE(torch::equal(plain, sixteen_bits));  // rounded to bf16 on the wire ...
  // ... and only that: relative to the whole, bf16 operands' rounding (cancelling sums make
  // single elements worse).
  EXPECT_LT(((plain - sixteen_bits).norm() / plain.norm()).item<double>(), 1e-2);
}

// divide_sum_by (expert parallelism's experts): the group's sum divided by another number than
// its size, whole or sharded, and by a group of one rank, which sends nothing.
TEST(GradientBuffer, SumDividedByTheGivenNumber) {
  MpiCommunicator dp(MPI_COMM_WORLD);
  MPI_Comm alone = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, dp.rank(), 0, &alone);
  MpiCommunicator self(alone);
  auto reduced = [&](Communicator& group, bool shard, int64_t divisor) {
    torch::manual_seed(7);
    Stack model(torch::kFloat32);
    GradientBuffer buffer(model.named, model.weights, {&group, torch::kFloat32, 1024, true, 1, shard, divisor});
    buffer.zero();
    model.loss(inputs(dp.rank(), 0)).backward();
    buffer.reduce();
    std::vector<torch::Tensor> regions;
    for (const torch::Tensor& region : buffer.owned_regions()) regions.push_back(region.clone());
    return torch::cat(regions);
  };
  for (bool shard : {false, true}) {
    const torch::Tensor average = reduced(dp, shard, 0), divided = reduced(dp, shard, 3 * dp.size());
    EXPECT_TRUE(torch::allclose(divided, average / 3, 1e-6, 1e-9)) << (shard ? "sharded" : "whole");
  }
  const torch::Tensor own = reduced(self, false, 0), own_divided = reduced(self, false, 4);
  EXPECT_GT(own.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(torch::allclose(own_divided, own / 4, 1e-6, 1e-9));
}

// bf16 gradients are copied into the buffer by their step's first arrival instead of added to a
// zeroed buffer: a step that leaves some parameters without a gradient must still average zeros
// for them, not what the last step left, whole or sharded.
TEST(GradientBuffer, ParametersWithoutAGradientThisStepAverageZero) {
  for (bool shard : {false, true}) {
    torch::manual_seed(7);
    Stack model(torch::kBFloat16);
    MpiCommunicator dp(MPI_COMM_WORLD);
    GradientBuffer buffer(model.named, model.weights, {&dp, torch::kFloat32, 2 * 16 * 16 * 4, true, 1, shard});
    buffer.zero();
    model.loss(inputs(dp.rank(), 0)).backward();
    buffer.reduce();
    buffer.zero();  // the next step uses the first three layers only
    torch::Tensor h = inputs(dp.rank(), 1);
    for (size_t i = 0; i < 3; ++i) h = torch::tanh(h.matmul(model.weights[i].to(torch::kFloat32)));
    h.pow(2).sum().backward();
    buffer.reduce();
    for (const ParameterShard& s : buffer.shards()) {
      const bool used = s.name < "layer.3";
      const float largest = s.grad.abs().max().item<float>();
      if (used)
        EXPECT_GT(largest, 0.0f) << s.name << (shard ? " sharded" : "");
      else
        EXPECT_EQ(largest, 0.0f) << s.name << (shard ? " sharded" : "");
    }
  }
}

// ZeRO-1: each rank reduce-scatters the buckets, updates its shard of the parameters with AdamW
// and all-gathers the rest; after every step the parameters equal those of the unsharded AdamW
// on the all-reduced gradients, and the ranks' optimizer state together is exactly the whole.
TEST(GradientBuffer, ShardedAdamWEqualsTheWholeUpdate) {
  if (MpiCommunicator(MPI_COMM_WORLD).size() == 1) GTEST_SKIP() << "one rank has no one to share its optimizer state with";
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    MpiCommunicator dp(MPI_COMM_WORLD);
    torch::manual_seed(7);
    Stack sharded(dtype);
    torch::manual_seed(7);
    Stack whole(dtype);
    // A bucket per matrix (256 elements): each split between the ranks, padded for 3 ranks.
    const int64_t bucket_bytes = 200 * 4;
    GradientBuffer sharded_buffer(sharded.named, sharded.weights, {&dp, torch::kFloat32, bucket_bytes, true, 1, true});
    GradientBuffer whole_buffer(whole.named, whole.weights, {&dp, torch::kFloat32, bucket_bytes, true, 1, false});
    ASSERT_TRUE(sharded_buffer.sharded());
    AdamWOptions options{0.9, 0.95, 1e-8, 0.1};
    AdamW sharded_adam(sharded_buffer.shards(), options), whole_adam(whole_buffer.shards(), options);
    ASSERT_EQ(sharded_buffer.shards().size(), whole.weights.size());
    for (const ParameterShard& s : sharded_buffer.shards()) EXPECT_FALSE(s.whole()) << s.name;

    torch::Tensor no_inf = torch::zeros({});
    for (int step = 0; step < 3; ++step) {
      for (auto [model, buffer, adam] : {std::tuple{&sharded, &sharded_buffer, &sharded_adam},
                                         std::tuple{&whole, &whole_buffer, &whole_adam}}) {
        buffer->zero();
        model->loss(inputs(dp.rank(), step)).backward();
        buffer->reduce();
        adam->step(1e-2, buffer->shard_grads(), no_inf);
        buffer->gather_parameters();
      }
      for (size_t i = 0; i < whole.weights.size(); ++i) {
        torch::Tensor a = sharded.weights[i].to(torch::kFloat32), b = whole.weights[i].to(torch::kFloat32);
        // fp32: the same arithmetic on the same numbers; bf16: the same masters, rounded alike.
        EXPECT_LT((a - b).abs().max().item<double>(), 1e-5)
            << "layer " << i << " step " << step << " " << c10::toString(dtype) << " on rank " << world_rank();
      }
    }
    torch::Tensor bytes = torch::full({1}, sharded_adam.state_bytes(), torch::kInt64);
    MPI_Allreduce(MPI_IN_PLACE, bytes.data_ptr<int64_t>(), 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(bytes.item<int64_t>(), whole_adam.state_bytes());
    EXPECT_LT(sharded_adam.state_bytes(), whole_adam.state_bytes() / dp.size() + whole_adam.state_bytes() / 6);
  }
}

namespace {

// Every rank's gradient for the quantized tests below, known to every rank.
torch::Tensor gradient_of(int rank, int64_t length) {
  torch::manual_seed(100 + rank);
  torch::Tensor g = torch::randn({length}, torch::kFloat64) * (rank + 1);
  g.narrow(0, 0, 256).zero_();  // a block of zeros
  g[300] = 1e4;                 // a block with one large value
  return g.to(torch::kFloat32).to(torch::kFloat64);
}

// The most a value of `g`'s blocks (of 256, zero-padded to `padded`) can be off after 8-bit
// quantization: half a step of the block's scale for int8, and for E4M3 a 16th of the value
// (3 mantissa bits) or, in its subnormal range, half its smallest step.
torch::Tensor quantization_bound(const torch::Tensor& g, int64_t padded, BlockFormat format) {
  torch::Tensor blocks = torch::zeros({padded}, torch::kFloat64);
  blocks.narrow(0, 0, g.numel()).copy_(g);
  blocks = blocks.view({-1, kQuantizationBlock});
  const torch::Tensor largest = blocks.abs().amax(1, true);
  torch::Tensor bound = format == BlockFormat::kInt8 ? (largest / 127 / 2).expand_as(blocks)
                                                     : blocks.abs() / 16 + largest / 448 * std::pow(2.0, -10);
  return bound.reshape({-1}).narrow(0, 0, g.numel());
}

}  // namespace

// 8-bit gradients (comm.grad_dtype = int8, fp8): the average is the exact one (fp64, from every
// rank's gradient) within the quantization's bound, plus bf16's rounding where the averaged
// chunks are all-gathered; every rank holds the same values; the bytes sent are the all-to-all's
// 8-bit codes and fp32 scales (and the bf16 all-gather's).
TEST(GradientBuffer, QuantizedAverageIsWithinItsErrorBound) {
  MpiCommunicator dp(MPI_COMM_WORLD);
  const int64_t n = dp.size(), length = 3000;
  const int64_t padded = (length + n * kQuantizationBlock - 1) / (n * kQuantizationBlock) * (n * kQuantizationBlock);
  const int64_t chunk = padded / n;
  for (BlockFormat format : {BlockFormat::kInt8, BlockFormat::kFp8E4M3}) {
    torch::Tensor exact = torch::zeros({length}, torch::kFloat64), bound = torch::zeros({length}, torch::kFloat64);
    for (int q = 0; q < n; ++q) {
      exact += gradient_of(q, length) / n;
      bound += quantization_bound(gradient_of(q, length), padded, format) / n;
    }
    for (bool shard : {false, true}) {
      SCOPED_TRACE(std::string(format == BlockFormat::kInt8 ? "int8" : "fp8") + (shard ? ", sharded" : ""));
      torch::Tensor w = torch::zeros({length}, torch::kFloat32).set_requires_grad(true);
      GradientReduction reduction{&dp, torch::kFloat32, int64_t{1} << 30, false, 1, shard};
      reduction.quantized = format;
      GradientBuffer buffer({{"w", w}}, {w}, reduction);
      buffer.zero();
      (w * gradient_of(dp.rank(), length).to(torch::kFloat32)).sum().backward();
      buffer.reduce();
      const torch::Tensor got = buffer.flat().narrow(0, 0, length).to(torch::kFloat64);
      // Where this rank holds the average: all of it, or sharded its chunk.
      const int64_t from = shard ? dp.rank() * chunk : 0, to = shard ? std::min(length, from + chunk) : length;
      const torch::Tensor error = (got - exact).abs().narrow(0, from, to - from);
      const torch::Tensor allowed = (bound * 1.01 + (shard ? 0.0 : 1.0) * exact.abs() / 256 + 1e-6).narrow(0, from, to - from);
      EXPECT_TRUE((error <= allowed).all().item<bool>())
          << "worst excess " << (error - allowed).max().item<double>() << " on rank " << dp.rank();
      EXPECT_TRUE(torch::equal(got.narrow(0, 0, 256), torch::zeros({256}, torch::kFloat64)));  // zeros stay exact
      if (!shard) {
        torch::Tensor everyone = torch::empty({n * length}, torch::kFloat32);
        dp.all_gather(everyone, buffer.flat().narrow(0, 0, length).contiguous());
        for (int64_t q = 1; q < n; ++q)
          EXPECT_TRUE(torch::equal(everyone.narrow(0, 0, length), everyone.narrow(0, q * length, length)));
      }
      const int64_t sent = (n - 1) * (chunk + chunk / kQuantizationBlock * 4) + (shard ? 0 : (n - 1) * chunk * 2);
      EXPECT_EQ(buffer.communication().bytes_sent, sent);
    }
  }
}

// Non-finite gradients are not hidden by the quantization: the block holding one comes back
// NaN, so the step's norm is not finite and the step stops as without it.
TEST(GradientBuffer, QuantizedInfinityComesBackNotFinite) {
  MpiCommunicator dp(MPI_COMM_WORLD);
  torch::Tensor w = torch::zeros({1024}, torch::kFloat32).set_requires_grad(true);
  GradientReduction reduction{&dp, torch::kFloat32, int64_t{1} << 30, false, 1, false};
  reduction.quantized = BlockFormat::kInt8;
  GradientBuffer buffer({{"w", w}}, {w}, reduction);
  buffer.zero();
  torch::Tensor g = torch::ones({1024});
  if (dp.rank() == 0) g[700] = std::numeric_limits<float>::infinity();
  (w * g).sum().backward();
  buffer.reduce();
  EXPECT_FALSE(torch::isfinite(buffer.flat().norm()).item<bool>());
  EXPECT_TRUE(torch::isfinite(buffer.flat().narrow(0, 0, 512)).all().item<bool>());  // other blocks as they were
}

// Error feedback: what quantizing lost is sent with the next step's gradient, so over K steps of
// the same gradient the mean of the averages is within 1/K of the quantization bound of exact.
TEST(GradientBuffer, ErrorFeedbackCarriesTheQuantizationErrorOver) {
  MpiCommunicator dp(MPI_COMM_WORLD);
  if (dp.size() == 1) GTEST_SKIP() << "one rank sends nothing: nothing is quantized, so no error is carried";
  const int64_t n = dp.size(), length = 3000, steps = 8;
  const int64_t padded = (length + n * kQuantizationBlock - 1) / (n * kQuantizationBlock) * (n * kQuantizationBlock);
  const int64_t chunk = padded / n;
  torch::Tensor exact = torch::zeros({length}, torch::kFloat64), bound = torch::zeros({length}, torch::kFloat64);
  for (int q = 0; q < n; ++q) {
    exact += gradient_of(q, length) / n;
    bound += quantization_bound(gradient_of(q, length), padded, BlockFormat::kInt8) / n;
  }
  torch::Tensor w = torch::zeros({length}, torch::kFloat32).set_requires_grad(true);
  GradientReduction reduction{&dp, torch::kFloat32, int64_t{1} << 30, false, 1, /*shard=*/true};
  reduction.quantized = BlockFormat::kInt8;
  reduction.error_feedback = true;
  GradientBuffer buffer({{"w", w}}, {w}, reduction);
  ASSERT_TRUE(buffer.error_feedback().defined());
  torch::Tensor mean = torch::zeros({length}, torch::kFloat64);
  for (int64_t step = 0; step < steps; ++step) {
    buffer.zero();
    (w * gradient_of(dp.rank(), length).to(torch::kFloat32)).sum().backward();
    buffer.reduce();
    mean += buffer.flat().narrow(0, 0, length).to(torch::kFloat64) / steps;
  }
  const int64_t from = dp.rank() * chunk, to = std::min(length, from + chunk);
  const torch::Tensor error = (mean - exact).abs().narrow(0, from, to - from);
  const torch::Tensor allowed = (bound / steps * 1.01 + 1e-5).narrow(0, from, to - from);
  EXPECT_TRUE((error <= allowed).all().item<bool>()) << "worst excess " << (error - allowed).max().item<double>();
}
