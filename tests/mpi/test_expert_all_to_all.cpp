// Expert parallelism's exchange (parallel/expert_all_to_all.h) on real ranks: each rank's rows,
// sent to the ranks holding their experts, computed there and sent back, come back as the rank
// would have computed them holding every expert itself (model/expert_exchange.h's local exchange),
// forward and backward; uneven counts, experts without rows and a rank that sends nothing included.
#include <gtest/gtest.h>
#include <mpi.h>

#include "dstrain/core/fp8_quantization.h"
#include "dstrain/parallel/expert_all_to_all.h"
#include "world_communicator.h"
#include "dstrain/parallel/mpi_communicator.h"

using namespace dstrain;

namespace {

constexpr int64_t kExpertsPerRank = 2, kWidth = 3;

// Expert e multiplies a row by its own matrix: what every rank can compute for any expert.
torch::Tensor expert_weights(int64_t experts) {
  torch::manual_seed(11);
  return torch::randn({experts, kWidth, kWidth}, torch::kFloat64);
}

// Rows sorted by expert, `counts` of each: through each one's matrix.
torch::Tensor through_experts(const torch::Tensor& rows, const std::vector<int64_t>& counts,
                              const torch::Tensor& weights, int64_t first_expert) {
  std::vector<torch::Tensor> parts;
  int64_t start = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    parts.push_back(rows.narrow(0, start, counts[e]).mm(weights[first_expert + static_cast<int64_t>(e)]));
    start += counts[e];
  }
  return torch::cat(parts);
}

// This rank's rows for each global expert: uneven, some none, and none at all from rank 1.
std::vector<int64_t> rows_per_expert(int rank, int64_t experts) {
  std::vector<int64_t> counts;
  for (int64_t e = 0; e < experts; ++e) counts.push_back(rank == 1 ? 0 : (rank + 2 * e) % 4);
  return counts;
}

// What every rank of `group` feeds an exchange: its rows (random, seeded by `seed` and the rank)
// with their upstream gradient, sorted by expert, and the experts' matrices.
struct RankRows {
  int64_t experts = 0;
  torch::Tensor weights;
  std::vector<int64_t> counts;
  int64_t total = 0;
  torch::Tensor source, upstream, count_tensor;
};

RankRows rank_rows(const Communicator& group, int seed) {
  RankRows r;
  r.experts = kExpertsPerRank * group.size();
  r.weights = expert_weights(r.experts);
  r.counts = rows_per_expert(group.rank(), r.experts);
  for (int64_t n : r.counts) r.total += n;
  torch::manual_seed(seed + group.rank());
  r.source = torch::randn({r.total, kWidth}, torch::kFloat64);
  r.upstream = torch::randn({r.total, kWidth}, torch::kFloat64);
  r.count_tensor = torch::tensor(r.counts, torch::kInt64);
  return r;
}

}  // namespace

TEST(ExpertAllToAll, EqualsEveryExpertComputedOnTheRankItself) {
  const std::unique_ptr<MpiCommunicator> world = world_communicator();
  MpiCommunicator& group = *world;
  const int rank = group.rank();
  const RankRows in = rank_rows(group, 100);
  const int64_t experts = in.experts;
  const torch::Tensor &weights = in.weights, &source = in.source, &upstream = in.upstream;
  const torch::Tensor& count_tensor = in.count_tensor;

  torch::Tensor local_rows = source.clone().requires_grad_(true);
  LocalExpertExchange local;
  const ExchangePlan local_plan = local.plan(count_tensor, false);
  torch::Tensor expected = local.combine(
      through_experts(local.dispatch(local_rows, local_plan), local_plan.rows_per_expert, weights, 0), local_plan);
  expected.backward(upstream);

  ExpertAllToAll exchange(LaneGroups(&group, nullptr));
  const ExpertShard shard = exchange.shard();
  EXPECT_EQ(shard.index, rank);
  EXPECT_EQ(shard.count, group.size());
  torch::Tensor rows = source.clone().requires_grad_(true);
  const ExchangePlan plan = exchange.plan(count_tensor, /*measured=*/true);
  ASSERT_EQ(static_cast<int64_t>(plan.rows_per_expert.size()), kExpertsPerRank);
  const torch::Tensor received = exchange.dispatch(rows, plan);
  int64_t mine = 0;
  for (int64_t n : plan.rows_per_expert) mine += n;
  EXPECT_EQ(received.size(0), mine);
  torch::Tensor got =
      exchange.combine(through_experts(received, plan.rows_per_expert, weights, shard.first(experts)), plan);
  got.backward(upstream);

  EXPECT_TRUE(torch::allclose(got, expected, 1e-12, 1e-12)) << "rank " << rank;
  EXPECT_TRUE(torch::allclose(rows.grad(), local_rows.grad(), 1e-12, 1e-12)) << "rank " << rank;
  EXPECT_GE(exchange.take_seconds(), 0.0);
  EXPECT_EQ(exchange.take_seconds(), 0.0) << "taken twice";
}

// train.fp8 = blockwise: the dispatched rows travel as E4M3 with a scale per 1×128 tile and arrive
// as the sender's rows quantized so; everything else is as without it: the results are the local
// computation's on the quantized rows, the gradients the local computation's (the rounding's
// gradient taken as the identity), and the bytes sent those of one byte per element plus the
// scales on the way out, whole elements for the rest.
TEST(ExpertAllToAll, Fp8DispatchSendsQuantizedRowsAndWholeGradients) {
  const std::unique_ptr<MpiCommunicator> world = world_communicator();
  MpiCommunicator& group = *world;
  const int rank = group.rank();
  const RankRows in = rank_rows(group, 200);
  const int64_t experts = in.experts, total = in.total;
  const torch::Tensor &weights = in.weights, &source = in.source, &upstream = in.upstream;
  const torch::Tensor& count_tensor = in.count_tensor;
  const torch::Tensor quantized = fp8_dequantize(fp8_quantize(source, {1, kFp8TileEdge})).to(torch::kFloat64);
  EXPECT_TRUE(total == 0 || !torch::equal(quantized, source)) << "rank " << rank << ": nothing was rounded";

  LocalExpertExchange local;
  torch::Tensor local_rows = source.clone().requires_grad_(true);
  const ExchangePlan local_plan = local.plan(count_tensor, false);
  const torch::Tensor expected =
      through_experts(quantized, local_plan.rows_per_expert, weights, 0);  // local: rows sorted already
  through_experts(local_rows, local_plan.rows_per_expert, weights, 0).backward(upstream);

  ExpertAllToAll exchange(LaneGroups(&group, nullptr), /*fp8_dispatch=*/true);
  torch::Tensor rows = source.clone().requires_grad_(true);
  const ExchangePlan plan = exchange.plan(count_tensor, /*measured=*/true);
  const torch::Tensor got = exchange.combine(
      through_experts(exchange.dispatch(rows, plan), plan.rows_per_expert, weights, exchange.shard().first(experts)),
      plan);
  got.backward(upstream);
  EXPECT_TRUE(torch::allclose(got, expected, 1e-12, 1e-12)) << "rank " << rank;
  EXPECT_TRUE(torch::allclose(rows.grad(), local_rows.grad(), 1e-12, 1e-12)) << "rank " << rank;

  int64_t sent = 0, received = 0;  // rows to and from other ranks
  for (int r = 0; r < group.size(); ++r)
    if (r != rank) {
      sent += plan.send_rows[static_cast<size_t>(r)];
      received += plan.recv_rows[static_cast<size_t>(r)];
    }
  const int64_t fp8_row = kWidth + 4, whole_row = kWidth * 8;  // E4M3 elements and one fp32 scale; float64
  EXPECT_EQ(exchange.take_bytes_sent(), sent * fp8_row + received * whole_row + (sent + received) * whole_row)
      << "rank " << rank;
}
