// Context parallelism's ring attention (model/context_parallel.h over
// parallel/context_parallel_collectives.h) on real ranks: against full causal attention in fp64 on
// every rank, forward and backward, with the balanced chunk order, chunks of one token included;
// and the work, counted in attention scores, the same on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <limits>
#include <memory>

#include "dstrain/model/context_parallel.h"
#include "dstrain/parallel/context_parallel_collectives.h"
#include "world_communicator.h"

using namespace dstrain;

namespace {

struct WorldRing {
  std::unique_ptr<MpiCommunicator> communicator = world_communicator();
  ContextParallelCollectives group{*communicator};
};

// softmax(q kᵀ · scale, the future masked) v, the whole sequence at once.
torch::Tensor full_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    double scale) {
  const int64_t s = q.size(2);
  const torch::Tensor future = torch::ones({s, s}, torch::kBool).triu(1);
  const torch::Tensor scores =
      (torch::matmul(q, k.transpose(-2, -1)) * scale).masked_fill(future, -std::numeric_limits<double>::infinity());
  return torch::matmul(scores.softmax(-1), v);
}

void expect_ring_equals_full_attention(int64_t chunk) {
  WorldRing ring;
  ContextParallelGroup& cp = ring.group;
  const int64_t batch = 2, heads = 3, seq = 2 * cp.size() * chunk, dq = 5, dv = 4;
  const double scale = 0.7;
  torch::manual_seed(7);  // the same whole sequence on every rank
  const auto fp64 = torch::kFloat64;
  torch::Tensor q = torch::randn({batch, heads, seq, dq}, fp64).requires_grad_();
  torch::Tensor k = torch::randn({batch, heads, seq, dq}, fp64).requires_grad_();
  torch::Tensor v = torch::randn({batch, heads, seq, dv}, fp64).requires_grad_();
  const torch::Tensor upstream = torch::randn({batch, heads, seq, dv}, fp64);
  const torch::Tensor expected = full_causal_attention(q, k, v, scale);
  expected.backward(upstream);

  auto mine = [&](const torch::Tensor& t) { return context_parallel_part(t, cp, 2); };
  torch::Tensor my_q = mine(q).detach().requires_grad_();
  // What passes: this rank's keys and values, stacked; its gradient comes back from every rank.
  torch::Tensor passed = torch::cat({mine(k), mine(v)}, -1).detach().requires_grad_();
  RingAttentionInputs in;
  in.query = my_q;
  in.passed = passed;
  in.keys_values = [dq, dv](const torch::Tensor& t) {
    return std::make_pair(t.narrow(-1, 0, dq), t.narrow(-1, dq, dv));
  };
  in.scale = scale;
  const torch::Tensor out = ring_attention(in, cp);
  out.backward(mine(upstream));
  EXPECT_TRUE(torch::allclose(out, mine(expected), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(my_q.grad(), mine(q.grad()), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(passed.grad().narrow(-1, 0, dq), mine(k.grad()), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(passed.grad().narrow(-1, dq, dv), mine(v.grad()), 1e-12, 1e-12));
}

}  // namespace

TEST(ContextParallel, RingAttentionEqualsFullCausalAttentionInFp64) { expect_ring_equals_full_attention(3); }

TEST(ContextParallel, RingAttentionWithChunksOfOneToken) { expect_ring_equals_full_attention(1); }

// Each rank scores the same number of (query, key) pairs: two chunk pairs a step, and over the
// group every pair of chunks whose query chunk is not before the key chunk once.
TEST(ContextParallel, EveryRankDoesTheSameAttentionWork) {
  WorldRing ring;
  ContextParallelGroup& cp = ring.group;
  const int64_t chunk = 4, chunks = 2 * cp.size();
  const torch::Tensor q = torch::randn({1, 2, 2 * chunk, 8});
  RingAttentionInputs in;
  in.query = q;
  in.passed = torch::stack({q, q});
  in.keys_values = [](const torch::Tensor& t) { return std::make_pair(t.select(0, 0), t.select(0, 1)); };
  int64_t scored = 0;
  ring_attention(in, cp, &scored);
  torch::Tensor all = torch::full({1}, scored, torch::kInt64);
  torch::Tensor most = all.clone(), least = -all;
  ring.communicator->all_reduce(all, ReduceOp::kSum);
  ring.communicator->all_reduce(most, ReduceOp::kMax);
  ring.communicator->all_reduce(least, ReduceOp::kMax);
  EXPECT_EQ(most.item<int64_t>(), -least.item<int64_t>());
  EXPECT_EQ(all.item<int64_t>(), 2 * chunk * chunk * chunks * (chunks + 1) / 2);
  EXPECT_EQ(ring.group.bytes_passed(), (cp.size() - 1) * in.passed.nbytes());
}
