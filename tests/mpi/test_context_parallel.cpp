// Context parallelism's ring attention (model/context_parallel.h over
// parallel/context_parallel_collectives.h) on real ranks: against full causal attention in fp64 on
// every rank, forward and backward, with the balanced chunk order, chunks of one token included,
// passing keys and values or a latent expanded where it arrives;
// and the work, counted in attention scores, the same on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
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

// Ring attention of what passes, expanded into keys and values by `expand` (with `parameters`),
// against full causal attention of the whole sequence's keys and values expanded alike: the
// output, the gradients of the queries and of what passed, and the parameters' gradients summed
// over the group.
void expect_ring_equals_full_attention(int64_t chunk, int64_t passed_width,
                                       const std::function<torch::Tensor(const torch::Tensor&, int64_t)>& expand,
                                       const std::vector<torch::Tensor>& parameters,
                                       int64_t score_block_elements = RingAttentionInputs{}.score_block_elements) {
  WorldRing ring;
  ContextParallelGroup& cp = ring.group;
  const int64_t batch = 2, heads = 3, seq = 2 * cp.size() * chunk, dq = 5;
  const double scale = 0.7;
  const auto fp64 = torch::kFloat64;
  torch::Tensor q = torch::randn({batch, heads, seq, dq}, fp64).requires_grad_();
  torch::Tensor whole = torch::randn({batch, heads, seq, passed_width}, fp64).requires_grad_();
  const torch::Tensor upstream = torch::randn({batch, heads, seq, expand(whole, 1).size(-1)}, fp64);
  const torch::Tensor expected = full_causal_attention(q, expand(whole, 0), expand(whole, 1), scale);
  expected.backward(upstream);
  std::vector<torch::Tensor> expected_parameter_grads;
  for (const torch::Tensor& p : parameters) {
    expected_parameter_grads.push_back(p.grad().clone());
    p.mutable_grad().zero_();
  }

  auto mine = [&](const torch::Tensor& t) { return context_parallel_part(t, cp, 2); };
  torch::Tensor my_q = mine(q).detach().requires_grad_();
  torch::Tensor passed = mine(whole).detach().requires_grad_();  // its gradient comes back from every rank
  RingAttentionInputs in;
  in.query = my_q;
  in.passed = passed;
  in.keys_values = [&](const torch::Tensor& t) { return std::make_pair(expand(t, 0), expand(t, 1)); };
  in.expansion_parameters = parameters;
  in.scale = scale;
  in.score_block_elements = score_block_elements;
  const torch::Tensor out = ring_attention(in, cp);
  out.backward(mine(upstream));
  EXPECT_TRUE(torch::allclose(out, mine(expected), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(my_q.grad(), mine(q.grad()), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(passed.grad(), mine(whole.grad()), 1e-12, 1e-12));
  for (size_t i = 0; i < parameters.size(); ++i) {
    torch::Tensor summed = parameters[i].grad().clone();
    ring.communicator->all_reduce(summed, ReduceOp::kSum);
    EXPECT_TRUE(torch::allclose(summed, expected_parameter_grads[i], 1e-12, 1e-12)) << "parameter " << i;
  }
}

// The keys and values themselves pass: keys the first 5 values of a position, values the next 4.
void expect_ring_of_keys_and_values_equals_full_attention(
    int64_t chunk, int64_t score_block_elements = RingAttentionInputs{}.score_block_elements) {
  torch::manual_seed(7);  // the same whole sequence on every rank
  auto keys_or_values = [](const torch::Tensor& t, int64_t which) {
    return which == 0 ? t.narrow(-1, 0, 5) : t.narrow(-1, 5, 4);
  };
  expect_ring_equals_full_attention(chunk, 9, keys_or_values, {}, score_block_elements);
}

}  // namespace

TEST(ContextParallel, RingAttentionEqualsFullCausalAttentionInFp64) {
  expect_ring_of_keys_and_values_equals_full_attention(3);
}

TEST(ContextParallel, RingAttentionWithChunksOfOneToken) { expect_ring_of_keys_and_values_equals_full_attention(1); }

// Chunks of 5 positions scored 2 query rows at a time (2 × 3 heads × 5 keys × 2 rows a block):
// blocks that end inside a chunk, and the diagonal's mask within a block.
TEST(ContextParallel, RingAttentionScoresInBlocksOfQueries) {
  expect_ring_of_keys_and_values_equals_full_attention(5, 2 * 3 * 5 * 2);
}

// MLA's way: a narrow latent passes and every rank expands it with its own copy of a projection,
// whose gradient is every rank's share of the whole sequence's.
TEST(ContextParallel, RingAttentionOfALatentDifferentiatesItsExpansion) {
  torch::manual_seed(11);
  const int64_t latent = 3;
  const std::vector<torch::Tensor> projections = {torch::randn({latent, 5}, torch::kFloat64).requires_grad_(),
                                                  torch::randn({latent, 4}, torch::kFloat64).requires_grad_()};
  expect_ring_equals_full_attention(
      2, latent, [&](const torch::Tensor& t, int64_t which) { return torch::matmul(t, projections[which]); },
      projections);
}

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

// What multi-token prediction reads: each rank's positions `ahead` places on, taken across the
// ends of its chunks from whichever rank holds the next one, zero past the sequence's end; the
// gradient returns to the rank holding each row. Against shifting the whole sequence, in fp64,
// with one position ahead and with a whole chunk ahead (every row from the next chunk).
TEST(ContextParallel, PositionsAheadComeFromTheNextChunks) {
  WorldRing ring;
  ContextParallelGroup& cp = ring.group;
  for (const int64_t ahead : {1, 3}) {
    torch::manual_seed(13);  // the same whole sequence on every rank
    const int64_t batch = 2, chunk = 3, seq = 2 * cp.size() * chunk, width = 4;
    const torch::Tensor whole = torch::randn({batch, seq, width}, torch::kFloat64);
    const torch::Tensor upstream = torch::randn({batch, seq, width}, torch::kFloat64);
    auto zeros = [&](int64_t n) { return torch::zeros({batch, n, width}, torch::kFloat64); };
    const torch::Tensor shifted = torch::cat({whole.narrow(1, ahead, seq - ahead), zeros(ahead)}, 1);
    // d(Σ upstream · shifted)/d(whole): the upstream of the position `ahead` before.
    const torch::Tensor gradient = torch::cat({zeros(ahead), upstream.narrow(1, 0, seq - ahead)}, 1);

    const torch::Tensor mine = context_parallel_part(whole, cp, 1).requires_grad_();
    const torch::Tensor out = context_parallel_ahead(mine, ahead, cp);
    out.backward(context_parallel_part(upstream, cp, 1));
    EXPECT_TRUE(torch::equal(out, context_parallel_part(shifted, cp, 1))) << "ahead " << ahead;
    EXPECT_TRUE(torch::allclose(mine.grad(), context_parallel_part(gradient, cp, 1), 1e-15, 0)) << "ahead " << ahead;
    EXPECT_EQ(context_parallel_tail(cp, ahead), cp.rank() == 0 ? ahead : 0);
  }
}
