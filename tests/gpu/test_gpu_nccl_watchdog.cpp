// The NCCL backend's watchdog on a stalled stream, at one rank (stall_watchdog.h; its naming of
// the ranks that stop answering is tested on the CPU: tests/mpi/test_stall_watchdog.cpp). A kernel
// that spins holds back an all-reduce queued after it, as a peer that never joins would: the
// watchdog ends the rank with exit code 5 after comm.timeout_s, naming the operation. The rank
// ends itself, so it runs as a process of its own: this program, running the disabled test below.
#include <gtest/gtest.h>

#ifdef DSTRAIN_WITH_NCCL
#include <ATen/cuda/Sleep.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "dstrain/core/accelerator.h"
#include "dstrain/parallel/nccl_communicator.h"
#include "dstrain/parallel/peer_health.h"
#include "e2e_util.h"

using namespace dstrain;

// Run only by the test after it, as a process of its own.
TEST(NcclWatchdogRank, DISABLED_StallsItsStream) {
  int provided = 0;
  ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), MPI_SUCCESS);
  peer_health::start();
  const torch::Device device(torch::kCUDA, 0);
  std::unique_ptr<Communicator> comm = make_nccl_communicator(MPI_COMM_WORLD, device, 2.0);
  torch::Tensor values = torch::ones({1024}, torch::dtype(torch::kFloat32).device(device));
  at::cuda::sleep(int64_t{1} << 40);  // minutes of spinning, queued before the all-reduce
  comm->all_reduce(values, ReduceOp::kSum);
  std::this_thread::sleep_for(std::chrono::seconds(60));  // the watchdog ends the process first
  ADD_FAILURE() << "the watchdog did not end the rank";
}

TEST(NcclWatchdog, AStalledStreamEndsTheRankWithExitCode5) {
  if (accel::device_count() == 0) GTEST_SKIP() << "no GPU on this machine";
  char self[4096] = {0};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  const e2e::RunOutput rank = e2e::run_shell(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 " + std::string(self) +
      " --gtest_filter=NcclWatchdogRank.DISABLED_StallsItsStream --gtest_also_run_disabled_tests");
  EXPECT_EQ(rank.exit_code, 5) << rank.output;
  EXPECT_NE(rank.output.find("error: an NCCL operation on 1 ranks (world ranks 0) did not finish within "
                             "comm.timeout_s = 2 s: a peer rank has died or hangs; ending this rank (exit code 5)"),
            std::string::npos)
      << rank.output;
}
#endif
