// The Communicator contract on real MPI ranks, for whichever backend DSTRAIN_TEST_BACKEND names:
//   mpi       MPI on CPU tensors (default)
//   mpi-cuda  MPI on GPU tensors, staged through host memory (ranks may share one GPU)
//   nccl      NCCL on GPU tensors (one GPU per rank)
// Every expected value is computed independently on the CPU.
#include <gtest/gtest.h>

#include <cstdlib>

#include "dstrain/core/accelerator.h"
#include "dstrain/parallel/device.h"
#include "dstrain/parallel/nccl_communicator.h"
#include "dstrain/parallel/parallel_context.h"

using namespace dstrain;

namespace {

struct TestBackend {
  std::string kind;
  torch::Device device = torch::kCPU;
  std::unique_ptr<Communicator> comm;
  std::string unavailable;  // why this machine cannot run it (the tests are then skipped)
};

TestBackend make_backend() {
  TestBackend b;
  const char* env = std::getenv("DSTRAIN_TEST_BACKEND");
  b.kind = env ? env : "mpi";
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (b.kind != "mpi") {
    if (accel::device_count() == 0) {
      b.unavailable = "no GPU";
      return b;
    }
    b.device = place_rank(DeviceRequest::kCuda).device;
  }
  if (b.kind == "nccl") {
#ifdef DSTRAIN_WITH_NCCL
    if (accel::device_count() < size) {
      b.unavailable = std::to_string(size) + " ranks need as many GPUs; this node has " +
                      std::to_string(accel::device_count());
      return b;
    }
    b.comm = make_nccl_communicator(MPI_COMM_WORLD, b.device, 60.0);
#else
    b.unavailable = "built without NCCL";
#endif
    return b;
  }
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  b.comm = std::make_unique<MpiCommunicator>(dup);
  return b;
}

TestBackend& backend() {
  static TestBackend b = make_backend();
  return b;
}

#define REQUIRE_BACKEND()                                                   \
  if (!backend().unavailable.empty()) GTEST_SKIP() << backend().kind << ": " << backend().unavailable

Communicator& world() { return *backend().comm; }
torch::Tensor on_device(const torch::Tensor& t) { return t.to(backend().device); }

// What rank r contributes: values that differ by rank and by position.
torch::Tensor contribution(int rank, int64_t n) {
  return torch::arange(n, torch::kFloat32) * (rank + 1) + 0.5f * rank;
}

}  // namespace

TEST(Communicator, AllReduceSumAverageMax) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  torch::Tensor expected_sum = torch::zeros({10});
  for (int r = 0; r < size; ++r) expected_sum += contribution(r, 10);
  torch::Tensor t = on_device(contribution(rank, 10));
  world().all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(torch::allclose(t.cpu(), expected_sum));
  t = on_device(contribution(rank, 10));
  world().all_reduce(t, ReduceOp::kAvg);
  EXPECT_TRUE(torch::allclose(t.cpu(), expected_sum / size));
  torch::Tensor m = on_device(torch::tensor({static_cast<int64_t>(rank), static_cast<int64_t>(-rank)}));
  world().all_reduce(m, ReduceOp::kMax);
  EXPECT_EQ(m[0].item<int64_t>(), size - 1);
  EXPECT_EQ(m[1].item<int64_t>(), 0);
}

// Two all-reduces in flight at once, completed in order: each the reduction of its own input.
TEST(Communicator, AsyncAllReducesInFlightTogether) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  torch::Tensor a = on_device(contribution(rank, 1000)), b = on_device(contribution(rank, 10) * 3);
  std::unique_ptr<Work> first = world().all_reduce_async(a, ReduceOp::kSum);
  std::unique_ptr<Work> second = world().all_reduce_async(b, ReduceOp::kAvg);
  first->wait();
  second->wait();
  torch::Tensor expected_a = torch::zeros({1000}), expected_b = torch::zeros({10});
  for (int r = 0; r < size; ++r) {
    expected_a += contribution(r, 1000);
    expected_b += contribution(r, 10) * 3;
  }
  EXPECT_TRUE(torch::allclose(a.cpu(), expected_a));
  EXPECT_TRUE(torch::allclose(b.cpu(), expected_b / size));
}

// 16-bit floating-point reductions (the compressed gradient path): small integers are exact in
// bf16 and fp16, so the sums must be exact too.
TEST(Communicator, AllReduceInBf16AndFp16) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  for (torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat16}) {
    torch::Tensor expected = torch::zeros({12});
    for (int r = 0; r < size; ++r) expected += torch::arange(12, torch::kFloat32) * (r + 1);
    torch::Tensor t = on_device((torch::arange(12, torch::kFloat32) * (rank + 1)).to(dtype));
    world().all_reduce(t, ReduceOp::kSum);
    EXPECT_EQ(t.scalar_type(), dtype);
    EXPECT_TRUE(torch::equal(t.cpu().to(torch::kFloat32), expected)) << c10::toString(dtype);
    t = on_device(torch::full({3}, static_cast<double>(rank), dtype));
    world().all_reduce(t, ReduceOp::kMax);
    EXPECT_EQ(t[0].item<float>(), static_cast<float>(size - 1));
  }
}

TEST(Communicator, ReduceScatterAndAllGather) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  const int64_t chunk = 3;
  torch::Tensor input = on_device(contribution(rank, chunk * size));
  torch::Tensor output = on_device(torch::empty({chunk}));
  world().reduce_scatter(output, input, ReduceOp::kSum);
  torch::Tensor expected = torch::zeros({chunk * size});
  for (int r = 0; r < size; ++r) expected += contribution(r, chunk * size);
  EXPECT_TRUE(torch::allclose(output.cpu(), expected.narrow(0, rank * chunk, chunk)));

  torch::Tensor gathered = on_device(torch::empty({size, 2}, torch::kFloat64));
  world().all_gather(gathered, on_device(torch::tensor({rank * 1.0, rank * 2.0}, torch::kFloat64)));
  gathered = gathered.cpu();
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(gathered[r][0].item<double>(), r * 1.0);
    EXPECT_EQ(gathered[r][1].item<double>(), r * 2.0);
  }
}


// Two all-gathers in flight at once, as ZeRO-1's parameter gather keeps them, completed in order:
// each gathers its own inputs, of different sizes and dtypes.
TEST(Communicator, AsyncAllGathersInFlightTogether) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  torch::Tensor mine_a = on_device(contribution(rank, 1000)), mine_b = on_device(torch::full({3}, rank, torch::kInt64));
  torch::Tensor all_a = on_device(torch::empty({size * 1000})), all_b = on_device(torch::empty({size * 3}, torch::kInt64));
  std::unique_ptr<Work> first = world().all_gather_async(all_a, mine_a);
  std::unique_ptr<Work> second = world().all_gather_async(all_b, mine_b);
  first->wait();
  second->wait();
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(torch::equal(all_a.cpu().narrow(0, r * 1000, 1000), contribution(r, 1000))) << "rank " << r;
    EXPECT_TRUE(torch::equal(all_b.cpu().narrow(0, r * 3, 3), torch::full({3}, r, torch::kInt64))) << "rank " << r;
  }
}
TEST(Communicator, Broadcast) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  torch::Tensor t = on_device(rank == size - 1 ? torch::tensor({7, 8, 9}, torch::kInt64) : torch::zeros({3}, torch::kInt64));
  world().broadcast(t, size - 1);
  EXPECT_TRUE(torch::equal(t.cpu(), torch::tensor({7, 8, 9}, torch::kInt64)));
}

TEST(Communicator, RingSendRecv) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  if (size == 1) GTEST_SKIP() << "one rank: a ring of one has no peer";
  // Even ranks send first, odd ranks receive first: no deadlock for any size.
  torch::Tensor mine = on_device(contribution(rank, 4)), from_left = on_device(torch::empty({4}));
  int right = (rank + 1) % size, left = (rank + size - 1) % size;
  if (rank % 2 == 0) {
    world().send(mine, right);
    world().recv(from_left, left);
  } else {
    world().recv(from_left, left);
    world().send(mine, right);
  }
  world().synchronize();
  EXPECT_TRUE(torch::equal(from_left.cpu(), contribution(left, 4)));
}

// A group posts every transfer at once: each rank sends to both neighbours and receives from
// both (with two ranks, the same peer twice each way), which blocking sends in a ring could not.
TEST(Communicator, ExchangeWithBothNeighboursInOneGroup) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  // Large enough that MPI cannot buffer a send and return before the receive is posted.
  const int64_t n = 1 << 20;
  torch::Tensor to_right = on_device(contribution(rank, n)), to_left = on_device(contribution(rank, n) * -1);
  torch::Tensor from_left = on_device(torch::empty({n})), from_right = on_device(torch::empty({n}));
  // Tag 0: travelling right, tag 1: travelling left; the same order at both ends.
  std::vector<Transfer> group = {{true, to_right, right, 0}, {false, from_left, left, 0},
                                 {true, to_left, left, 1}, {false, from_right, right, 1}};
  world().exchange(group);
  world().synchronize();
  EXPECT_TRUE(torch::equal(from_left.cpu(), contribution(left, n)));
  EXPECT_TRUE(torch::equal(from_right.cpu(), contribution(right, n) * -1));
}

// A send whose owner lets go of it, and of its tensor, before the receive is even posted (as an
// error unwinding past a pipeline stage does) still delivers its data: its memory outlives it
// until MPI is done with it, though the sender's allocator has handed out as much since and
// filled it. Large enough that MPI reads the sender's memory only when the receive comes.
TEST(Communicator, ASendLetGoOfBeforeItsReceiveStillDeliversItsData) {
  REQUIRE_BACKEND();
  // NCCL matches transfers in posting order: there the signal below would meet the data.
  if (backend().kind == "nccl") GTEST_SKIP() << "nccl: the signal would overtake the send";
  const int size = world().size(), rank = world().rank();
  if (size == 1) GTEST_SKIP() << "one rank: no peer to send to";
  const int64_t n = int64_t{4} << 20;  // 16 MiB
  torch::Tensor signal = torch::zeros({1});
  if (rank == 0) {
    world().send_async(on_device(contribution(0, n)), 1, /*tag=*/7);  // let go of at once
    std::vector<torch::Tensor> reuse;
    for (int i = 0; i < 4; ++i) reuse.push_back(on_device(torch::full({n}, -1.0f)));
    world().send(signal, 1);  // now the receive may come
    world().recv(signal, 1);  // received
  } else if (rank == 1) {
    torch::Tensor received = on_device(torch::zeros({n}));
    world().recv(signal, 0);
    std::vector<Transfer> receive = {{false, received, 0, 7}};
    world().exchange(receive);
    world().send(signal, 0);
    EXPECT_TRUE(torch::equal(received.cpu(), contribution(0, n)));
  }
  world().barrier();
}

// A send that does not wait for its receiver: rank 0 sends to rank 1 (to itself at one rank) and
// goes on into a barrier, which waits for the receiver, which posts its receive only after it;
// the data arrive whole. One way only: on NCCL a receive queued behind the rank's own waiting send
// would wait for it. Large enough that MPI cannot buffer it.
TEST(Communicator, ASendThatDoesNotWaitCompletesWhenItsReceiveComesLater) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  // An NCCL send to oneself completes only in one group with its receive.
  if (size == 1 && backend().kind == "nccl") GTEST_SKIP() << "nccl: one rank has no peer";
  const int receiver = size > 1 ? 1 : 0;
  const int64_t n = int64_t{1} << 20;
  std::unique_ptr<Work> sent;
  if (rank == 0) sent = world().send_async(on_device(contribution(0, n)), receiver, /*tag=*/3);
  ASSERT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);  // MPI's own: NCCL's would wait for the send
  if (rank == receiver) {
    torch::Tensor received = on_device(torch::zeros({n}));
    std::vector<Transfer> receive = {{false, received, 0, 3}};
    world().exchange(receive);
    world().synchronize();
    EXPECT_TRUE(torch::equal(received.cpu(), contribution(0, n)));
  }
  if (sent) sent->wait();
  world().synchronize();
}

// make_subgroup: the members in the order given (here the even ranks, highest first), each
// numbered by its place; the others get none.
TEST(Communicator, ASubgroupHoldsItsMembersInTheOrderGiven) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  std::vector<int> members;
  for (int r = size - 1; r >= 0; --r)
    if (r % 2 == 0) members.push_back(r);
  std::unique_ptr<Communicator> sub = world().make_subgroup(members);
  if (rank % 2 != 0) {
    EXPECT_FALSE(sub);
  } else {
    ASSERT_TRUE(sub);
    EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
    EXPECT_EQ(members.at(static_cast<size_t>(sub->rank())), rank);
    EXPECT_EQ(sub->backend(), world().backend());
    torch::Tensor sum = on_device(torch::full({3}, float(rank + 1)));
    sub->all_reduce(sum, ReduceOp::kSum);
    sub->synchronize();
    float expected = 0;
    for (int r : members) expected += float(r + 1);
    EXPECT_TRUE(torch::equal(sum.cpu(), torch::full({3}, expected)));
  }
  world().barrier();
}

// Rank r sends (r + p) % 3 rows to rank p (so some pairs move nothing, a rank's own rows
// included), each row naming its sender, receiver and position; every rank finds exactly the rows
// addressed to it, in sender order.
TEST(Communicator, AllToAllMovesUnevenRowsIncludingNone) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  auto rows_between = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
  auto row = [](int from, int to, int64_t i) {
    return torch::tensor({static_cast<float>(from), static_cast<float>(to), static_cast<float>(i)});
  };
  std::vector<int64_t> send_rows, recv_rows;
  std::vector<torch::Tensor> outgoing, expected;
  for (int peer = 0; peer < size; ++peer) {
    send_rows.push_back(rows_between(rank, peer));
    recv_rows.push_back(rows_between(peer, rank));
    for (int64_t i = 0; i < send_rows.back(); ++i) outgoing.push_back(row(rank, peer, i));
    for (int64_t i = 0; i < recv_rows.back(); ++i) expected.push_back(row(peer, rank, i));
  }
  auto stacked = [](const std::vector<torch::Tensor>& rows) {
    return rows.empty() ? torch::empty({0, 3}) : torch::stack(rows);
  };
  torch::Tensor input = on_device(stacked(outgoing)), output = on_device(torch::full({static_cast<int64_t>(expected.size()), 3}, -1.0));
  world().all_to_all(output, input, send_rows, recv_rows);
  world().synchronize();
  EXPECT_TRUE(torch::equal(output.cpu(), stacked(expected)));
  // Nothing at all to move works too.
  torch::Tensor none = on_device(torch::empty({0, 3}));
  world().all_to_all(none, none, std::vector<int64_t>(size, 0), std::vector<int64_t>(size, 0));
  world().synchronize();
}

// The result of a collective is visible to the very next kernel on the caller's stream, without
// any explicit synchronisation (for NCCL: the events that order its stream and the caller's).
TEST(Communicator, ResultIsOrderedBeforeTheCallersNextKernel) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  torch::Tensor big = on_device(torch::full({1 << 22}, static_cast<double>(rank + 1)));
  world().all_reduce(big, ReduceOp::kSum);
  torch::Tensor total = big.sum();  // queued right after the collective
  EXPECT_DOUBLE_EQ(total.item<double>(), static_cast<double>(1 << 22) * size * (size + 1) / 2);
}

// Every kind of group is a communicator over the ranks the grid names, each member at its place,
// for the layouts these ranks allow (pp 1 or 2, ep 1 or 2, two orders); kinds with the same
// groups share one communicator.
TEST(ParallelContext, EveryGroupIsTheGridsGroup) {
  REQUIRE_BACKEND();
  const int size = world().size(), rank = world().rank();
  const Backend group_backend = backend().kind == "nccl" ? Backend::kNccl : Backend::kMpi;
  for (int pp : {1, 2})
    for (int ep : {1, 2})
      for (const char* order : {"tp-cp-ep-dp-pp", "pp-dp"}) {
        if (size % pp != 0 || (size / pp) % ep != 0) continue;
        ParallelConfig layout;
        layout.dp = size / pp;
        layout.pp = pp;
        layout.ep = ep;
        layout.order = order;
        const ParallelGrid grid(layout);
        const ParallelContext ctx = ParallelContext::create(grid, group_backend, backend().device);
        const std::string where = std::string(order) + " pp " + std::to_string(pp) + " ep " + std::to_string(ep);
        for (Group kind : every_group()) {
          Communicator& group = ctx.group(kind);
          const std::string what = where + ", group " + name_of(group_names(), kind);
          EXPECT_EQ(group.backend(), group_backend) << what;
          EXPECT_EQ(group.size(), grid.size(kind)) << what;
          EXPECT_EQ(group.rank(), grid.rank_in(kind, rank)) << what;
          // Summing world ranks over the group gives the sum of the members the grid names.
          torch::Tensor sum = on_device(torch::tensor({static_cast<int64_t>(rank)}));
          group.all_reduce(sum, ReduceOp::kSum);
          int64_t expected = 0;
          for (int member : grid.members(kind, rank)) expected += member;
          EXPECT_EQ(sum.item<int64_t>(), expected) << what;
        }
        EXPECT_EQ(&ctx.group(Group::kDpCp), &ctx.group(Group::kDp)) << where << ": cp = 1";
        EXPECT_EQ(&ctx.group(Group::kEdp) == &ctx.group(Group::kDp), ep == 1) << where;
        EXPECT_EQ(ctx.expert_lanes().main(), &ctx.group(Group::kEp));
      }
}

TEST(ParallelContext, FailureAgreementNamesTheLowestFailingRank) {
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  FailureAgreement none = agree_on_failure(0);
  EXPECT_EQ(none.exit_code, 0);
  // Ranks 1.. fail with their rank number as the code: the worst code wins, rank 1 reports.
  FailureAgreement some = agree_on_failure(rank);
  EXPECT_EQ(some.exit_code, size - 1);
  EXPECT_EQ(some.reporter, size > 1 ? 1 : -1);
}
