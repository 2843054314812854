// The watchdog of a backend whose operations wait on a device (NCCL; stall_watchdog.h), on the
// CPU: a stalled operation ends the watch with the rank that stopped answering named first, as the
// MPI backend's timeouts name it, while the watchdog answers for its own rank, whose threads are
// stuck. Every rank but the last watches an operation that never finishes; the last one stops
// answering (it waits in a plain MPI barrier, which answers nobody, its communicator idle).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "dstrain/parallel/peer_health.h"
#include "dstrain/parallel/stall_watchdog.h"

using namespace dstrain;

namespace {

std::string host_name() {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace

TEST(StallWatchdog, NamesTheRankThatStoppedAnsweringFirst) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs a rank that stops answering and one that watches";
  peer_health::start();
  const int silent = size - 1;
  // With 3 ranks or more, rank 1's operation is not late: it is not asking anyone itself, and only
  // its watchdog's own rounds answer for it.
  const bool patient = rank == 1 && size >= 3;
  const std::vector<int> world = peer_health::world_ranks_of(MPI_COMM_WORLD);
  const std::string what = "an operation on " + peer_health::describe_group(world);
  auto watch = [&](std::chrono::steady_clock::time_point queued, std::promise<std::string>& ended) {
    return StallWatch{[what] { return what; }, world, 1.0,
                      [queued] { return CommunicatorState{CommunicatorState::Kind::kUnfinished, queued, ""}; },
                      nullptr, [&ended](const std::string& reason) { ended.set_value(reason); }};
  };
  std::promise<std::string> ended;
  std::future<std::string> why = ended.get_future();
  if (patient) {
    const StallWatchdog watchdog(watch(std::chrono::steady_clock::now() + std::chrono::hours(1), ended));
    MPI_Barrier(MPI_COMM_WORLD);  // blocked as in a CUDA call, until the others are done
    EXPECT_NE(why.wait_for(std::chrono::seconds(0)), std::future_status::ready) << "ended before its timeout";
  } else if (rank != silent) {
    std::string message;
    {
      const StallWatchdog watchdog(watch(std::chrono::steady_clock::now(), ended));
      if (why.wait_for(std::chrono::seconds(60)) == std::future_status::ready) message = why.get();
    }
    const std::string host = host_name();
    EXPECT_EQ(message.rfind("world rank " + std::to_string(silent) + " (host " + host +
                                ") did not answer within 2 s: stopped, hung outside communication, or dead",
                            0),
              0u)
        << message;
    for (int other = 0; other < silent; ++other) {
      if (other == rank) continue;
      EXPECT_NE(message.find("; world rank " + std::to_string(other) + " (host " + host + ") was waiting in " + what),
                std::string::npos)
          << message;
    }
    const std::string late = ". This rank's " + what + " did not finish within comm.timeout_s = 1 s";
    EXPECT_EQ(message.size() >= late.size() ? message.substr(message.size() - late.size()) : "", late) << message;
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    // Hung in its own code, its communicator idle: its watchdog must not answer for it.
    const StallWatchdog idle(StallWatch{[what] { return what; }, world, 1.0, [] { return CommunicatorState{}; },
                                        nullptr, [&ended](const std::string& reason) { ended.set_value(reason); }});
    MPI_Barrier(MPI_COMM_WORLD);  // a plain MPI wait answers nobody
    peer_health::answer();        // the pings it took no notice of
  }
  peer_health::stop();
}

// An asynchronous error ends the watch at once with the communicator's own words; a communicator
// that stays idle is never reported.
TEST(StallWatchdog, ReportsAnAsynchronousErrorAndNothingWhileIdle) {
  std::promise<std::string> ended;
  std::future<std::string> why = ended.get_future();
  bool failing = false;
  std::mutex mutex;
  {
    StallWatchdog watchdog(StallWatch{[] { return std::string("an operation"); }, {0}, 1.0,
                                      [&] {
                                        std::lock_guard<std::mutex> lock(mutex);
                                        if (!failing) return CommunicatorState{};
                                        return CommunicatorState{CommunicatorState::Kind::kFailed, {}, "it broke"};
                                      },
                                      nullptr, [&](const std::string& reason) { ended.set_value(reason); }});
    EXPECT_EQ(why.wait_for(std::chrono::milliseconds(1600)), std::future_status::timeout);  // idle past the timeout
    {
      std::lock_guard<std::mutex> lock(mutex);
      failing = true;
    }
    ASSERT_EQ(why.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    EXPECT_EQ(why.get(), "it broke");
  }
}
