#include <gtest/gtest.h>

#include "dstrain/dist/parallel_context.h"

using namespace dstrain;

namespace {

MpiCommunicator& world() {
  static MpiCommunicator comm(MPI_COMM_WORLD);
  return comm;
}

// What rank r contributes: values that differ by rank and by position.
torch::Tensor contribution(int rank, int64_t n) {
  return torch::arange(n, torch::kFloat32) * (rank + 1) + 0.5f * rank;
}

}  // namespace

TEST(MpiCommunicator, AllReduceSumAverageMax) {
  const int size = world().size(), rank = world().rank();
  torch::Tensor expected_sum = torch::zeros({10});
  for (int r = 0; r < size; ++r) expected_sum += contribution(r, 10);
  torch::Tensor t = contribution(rank, 10);
  world().all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(torch::allclose(t, expected_sum));
  t = contribution(rank, 10);
  world().all_reduce(t, ReduceOp::kAvg);
  EXPECT_TRUE(torch::allclose(t, expected_sum / size));
  torch::Tensor m = torch::tensor({static_cast<int64_t>(rank), static_cast<int64_t>(-rank)});
  world().all_reduce(m, ReduceOp::kMax);
  EXPECT_EQ(m[0].item<int64_t>(), size - 1);
  EXPECT_EQ(m[1].item<int64_t>(), 0);
}

TEST(MpiCommunicator, ReduceScatterAndAllGather) {
  const int size = world().size(), rank = world().rank();
  const int64_t chunk = 3;
  torch::Tensor input = contribution(rank, chunk * size);
  torch::Tensor output = torch::empty({chunk});
  world().reduce_scatter(output, input, ReduceOp::kSum);
  torch::Tensor expected = torch::zeros({chunk * size});
  for (int r = 0; r < size; ++r) expected += contribution(r, chunk * size);
  EXPECT_TRUE(torch::allclose(output, expected.narrow(0, rank * chunk, chunk)));

  torch::Tensor gathered = torch::empty({size, 2}, torch::kFloat64);
  world().all_gather(gathered, torch::tensor({rank * 1.0, rank * 2.0}, torch::kFloat64));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(gathered[r][0].item<double>(), r * 1.0);
    EXPECT_EQ(gathered[r][1].item<double>(), r * 2.0);
  }
}

TEST(MpiCommunicator, BroadcastAndRingSendRecv) {
  const int size = world().size(), rank = world().rank();
  torch::Tensor t = rank == size - 1 ? torch::tensor({7, 8, 9}, torch::kInt64) : torch::zeros({3}, torch::kInt64);
  world().broadcast(t, size - 1);
  EXPECT_TRUE(torch::equal(t, torch::tensor({7, 8, 9}, torch::kInt64)));

  // Even ranks send first, odd ranks receive first: no deadlock for any size.
  torch::Tensor mine = contribution(rank, 4), from_left = torch::empty({4});
  int right = (rank + 1) % size, left = (rank + size - 1) % size;
  if (rank % 2 == 0) {
    world().send(mine, right);
    world().recv(from_left, left);
  } else {
    world().recv(from_left, left);
    world().send(mine, right);
  }
  EXPECT_TRUE(torch::equal(from_left, contribution(left, 4)));
}

TEST(ParallelContext, GroupsMatchTheRankGrid) {
  const int size = world().size(), rank = world().rank();
  for (int pp : {1, 2}) {
    if (size % pp != 0) continue;
    RankGrid grid(size, size / pp, pp);
    ParallelContext ctx = ParallelContext::create(grid);
    EXPECT_EQ(ctx.dp_group->size(), size / pp);
    EXPECT_EQ(ctx.pp_group->size(), pp);
    EXPECT_EQ(ctx.dp_group->rank(), grid.coord(rank).dp);
    EXPECT_EQ(ctx.pp_group->rank(), grid.coord(rank).pp);
    // Summing world ranks over each group gives the sum of the members the grid names.
    torch::Tensor dp_sum = torch::tensor({static_cast<int64_t>(rank)});
    ctx.dp_group->all_reduce(dp_sum, ReduceOp::kSum);
    int64_t expected = 0;
    for (int member : grid.dp_group(rank)) expected += member;
    EXPECT_EQ(dp_sum.item<int64_t>(), expected);
    torch::Tensor pp_sum = torch::tensor({static_cast<int64_t>(rank)});
    ctx.pp_group->all_reduce(pp_sum, ReduceOp::kSum);
    expected = 0;
    for (int member : grid.pp_group(rank)) expected += member;
    EXPECT_EQ(pp_sum.item<int64_t>(), expected);
  }
}

TEST(ParallelContext, FailureAgreementNamesTheLowestFailingRank) {
  const int size = world().size(), rank = world().rank();
  FailureAgreement none = agree_on_failure(0);
  EXPECT_EQ(none.exit_code, 0);
  // Ranks 1.. fail with their rank number as the code: the worst code wins, rank 1 reports.
  FailureAgreement some = agree_on_failure(rank);
  EXPECT_EQ(some.exit_code, size - 1);
  EXPECT_EQ(some.reporter, 1);
}
