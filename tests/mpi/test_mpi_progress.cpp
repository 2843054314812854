// The MPI backend's progress thread (parallel/mpi_progress.h) on real ranks: an all-reduce started
// before a stretch without MPI calls (a backward pass) completes during it, with the rank's own
// thread making no MPI call at all; without the thread it is still under way when the stretch
// ends, as Open MPI moves a nonblocking collective only inside MPI calls. The reduction is long
// (64 MB, several rounds of Open MPI's nonblocking algorithm) so that it cannot complete within
// the call that starts it. Orderings only: how long anything takes is a benchmark's matter.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

#include "dstrain/parallel/mpi_check.h"
#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/parallel/mpi_progress.h"

using namespace dstrain;

namespace {

// A sum over every rank of `data`, started, and watched by the progress thread where it runs.
struct StartedSum {
  MPI_Request request = MPI_REQUEST_NULL;
  std::unique_ptr<mpi_progress::Watched> watched;

  StartedSum(MPI_Comm comm, torch::Tensor& data) {
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data.data_ptr<float>(), static_cast<int>(data.numel()), MPI_FLOAT, MPI_SUM,
                             comm, &request));
    watched = std::make_unique<mpi_progress::Watched>(request);
  }
  void finish() {
    while (!watched->test()) std::this_thread::yield();
  }
};

// Whether the sum is seen complete within `seconds` of polling that calls no MPI.
bool completes_without_mpi_calls(const StartedSum& sum, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (sum.watched->seen_complete()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return sum.watched->seen_complete();
}

}  // namespace

TEST(MpiProgress, AStartedReductionMovesWhileTheRankComputes) {
  const char* backend = std::getenv("DSTRAIN_TEST_BACKEND");
  if (backend && std::string(backend) != "mpi") GTEST_SKIP() << "the MPI backend's thread";
  if (MpiCommunicator(MPI_COMM_WORLD).size() == 1) GTEST_SKIP() << "one rank's reduction moves nothing";
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) GTEST_SKIP() << "this MPI library gives no MPI_THREAD_MULTIPLE";
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  MpiCommunicator comm(dup);
  torch::Tensor data = torch::ones({16 << 20});  // 64 MB of fp32
  torch::Tensor warm_up = data.clone();
  comm.all_reduce(warm_up, ReduceOp::kSum);  // the first one sets up shared memory

  // With the thread: complete while this thread calls no MPI (bounded only against a hang; a
  // loaded machine makes it slower, never wrong).
  mpi_progress::configure(true);
  ASSERT_TRUE(mpi_progress::running());
  comm.barrier();
  StartedSum with_thread(dup, data);
  EXPECT_TRUE(completes_without_mpi_calls(with_thread, 120)) << "the reduction did not move during the computation";
  with_thread.finish();

  // Without it: still under way after a stretch without MPI calls, on every rank.
  mpi_progress::configure(false);
  ASSERT_FALSE(mpi_progress::running());
  comm.barrier();
  StartedSum without_thread(dup, data);
  EXPECT_FALSE(completes_without_mpi_calls(without_thread, 0.2))
      << "completed without the thread: the comparison shows nothing on this MPI library";
  without_thread.finish();

  // Every rank's sums are right either way: 1, then × size with each reduction.
  EXPECT_EQ(data[12345].item<float>(), static_cast<float>(std::pow(comm.size(), 2)));
}
