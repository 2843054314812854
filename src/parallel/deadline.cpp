#include "dstrain/parallel/deadline.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>


namespace dstrain {

Deadline::Deadline(std::string what, double timeout_s, std::string why, ExitCode code)
    : what_(std::move(what)), why_(std::move(why)), timeout_s_(timeout_s), code_(code), thread_([this] { watch(); }) {}

Deadline::~Deadline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
  }
  over_.notify_one();
  thread_.join();
}

void Deadline::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto limit = std::chrono::duration<double>(timeout_s_);
  if (over_.wait_for(lock, limit, [this] { return finished_; })) return;
  // The rank is blocked inside MPI (or NCCL), which no exception can leave: say why, and end.
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!rank) rank = std::getenv("PMI_RANK");
  if (!rank) rank = std::getenv("SLURM_PROCID");
  std::fprintf(stderr, "error: %s did not finish within comm.timeout_s = %g s (rank %s on %s): %s; the job ends (exit code %d)\n",
               what_.c_str(), timeout_s_, rank ? rank : "?", host, why_.c_str(), static_cast<int>(code_));
  if (!partial_file_.empty()) ::unlink(partial_file_.c_str());  // (by every rank; the first one wins)
  std::fflush(stderr);
  std::_Exit(static_cast<int>(code_));
}

double startup_timeout_s(const std::string& comm_timeout) {
  char* end = nullptr;
  const double seconds = std::strtod(comm_timeout.c_str(), &end);
  // A value that is not a number is reported by the configuration's own check, later.
  return !comm_timeout.empty() && *end == '\0' && seconds >= 1 ? seconds : 600;
}

}  // namespace dstrain
