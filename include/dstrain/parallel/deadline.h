// A bound on a phase whose calls have no timeout of their own and cannot be left by an exception:
// MPI_Init waits for every rank to start (Open MPI's PMIx fence); the first agreements and the
// communicators' set-up are blocking collectives (NCCL's included); parallel HDF5 creates a
// checkpoint's file and datasets in collective calls, which a rank whose write failed (a full
// disk) leaves the others waiting in, and may itself hang in while it unwinds (a collective close).
// While a Deadline lives, a thread of its own waits for it; when the time runs out first, the rank
// prints what it was doing and why that may be, and ends with the given exit code, which makes the
// launcher (mpirun, srun) end the job.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "dstrain/core/error.h"

namespace dstrain {

class Deadline {
 public:
  // `what`: the phase, as the message names it ("MPI start-up", ...); `why`: what the user should
  // suspect; `code`: the exit code.
  Deadline(std::string what, double timeout_s, std::string why, ExitCode code);
  ~Deadline();  // the phase is over: the thread ends
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  // A partial file the phase is making, removed if the time runs out: a checkpoint's file on a
  // full disk would otherwise keep the disk full.
  void remove_on_expiry(std::string path) { partial_file_ = std::move(path); }

  // A phase of a multi-rank start-up (exit code 5).
  static constexpr const char* kStartup = "another rank has not started, has stopped (SIGSTOP, a debugger) or died";

 private:
  void watch();

  std::string what_, why_, partial_file_;
  double timeout_s_;
  ExitCode code_;
  std::mutex mutex_;
  std::condition_variable over_;
  bool finished_ = false;
  std::thread thread_;
};

// The bound a start-up takes before its configuration is read: comm.timeout_s's default, or the
// value given on the command line or in the INI file (`comm_timeout`, "" when none).
double startup_timeout_s(const std::string& comm_timeout);

}  // namespace dstrain
