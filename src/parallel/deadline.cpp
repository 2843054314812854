#include "dstrain/parallel/deadline.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dstrain/core/log_writer.h"


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
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", timeout_s_);
  log::output(stderr, "error: " + what_ + " did not finish within comm.timeout_s = " + timeout + " s (rank " +
                          (rank ? rank : "?") + " on " + host + "): " + why_ + "; the job ends (exit code " +
                          std::to_string(static_cast<int>(code_)) + ")\n");
  if (!partial_file_.empty()) ::unlink(partial_file_.c_str());  // (by every rank; the first one wins)
  log::drain(log::kDrainStallSeconds);  // the lines before it too, unless nobody reads them
  std::_Exit(static_cast<int>(code_));
}

double startup_timeout_s(const std::string& comm_timeout) {
  char* end = nullptr;
  const double seconds = std::strtod(comm_timeout.c_str(), &end);
  // A value that is not a number is reported by the configuration's own check, later.
  return !comm_timeout.empty() && *end == '\0' && seconds >= 1 ? seconds : 600;
}

}  // namespace dstrain
