// A bound on a start-up phase that has no timeout of its own. MPI_Init waits for every rank to
// start (Open MPI's PMIx fence), and the first agreements and the communicators' set-up are
// blocking collectives (NCCL's included): a rank stopped or dead at that moment would leave the
// others waiting forever, before comm.timeout_s means anything. While a StartupDeadline lives, a
// thread of its own waits for it; when the time runs out first, the rank prints what it was
// waiting for and ends with exit code 5 (communication), which makes the launcher (mpirun, srun)
// end the job.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace dstrain {

class StartupDeadline {
 public:
  // `what`: the phase, as the message names it ("MPI start-up", ...).
  StartupDeadline(std::string what, double timeout_s);
  ~StartupDeadline();  // the phase is over: the thread ends
  StartupDeadline(const StartupDeadline&) = delete;
  StartupDeadline& operator=(const StartupDeadline&) = delete;

 private:
  void watch();

  std::string what_;
  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable over_;
  bool finished_ = false;
  std::thread thread_;
};

// The bound a start-up takes before its configuration is read: comm.timeout_s's default, or the
// value given on the command line or in the INI file (`comm_timeout`, "" when none).
double startup_timeout_s(const std::string& comm_timeout);

}  // namespace dstrain
