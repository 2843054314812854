// The gradient buffer's data-parallel average on real MPI ranks: bucketed and started during the
// backward pass, it equals the plain average computed independently; sharded (ZeRO-1), the
// optimizer's update equals the unsharded one.
#include <gtest/gtest.h>
#include <mpi.h>

#include <tuple>

#include "dstrain/dist/mpi_communicator.h"
#include "dstrain/optim/adamw.h"
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
