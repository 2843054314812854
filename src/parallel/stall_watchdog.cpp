#include "dstrain/parallel/stall_watchdog.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/core/log_writer.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/parallel/peer_health.h"

namespace dstrain {
namespace {

constexpr auto kTick = std::chrono::milliseconds(500);

void end_process(const std::string& why) {
  log::error(why, "; ending this rank (exit code 5)");
  log::drain(log::kDrainStallSeconds);
  std::_Exit(static_cast<int>(ExitCode::kCommunication));
}

// This thread may ask and answer the other ranks only where MPI lets every thread call it.
bool mpi_from_any_thread() {
  int initialized = 0, finalized = 0, level = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Initialized(&initialized));
  MPI_CHECK(MPI_Finalized(&finalized));
  if (!initialized || finalized) return false;
  MPI_CHECK(MPI_Query_thread(&level));
  return level == MPI_THREAD_MULTIPLE;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", seconds);
  return text;
}

}  // namespace

StallWatchdog::StallWatchdog(StallWatch watch) : watch_(std::move(watch)) {
  if (!watch_.end) watch_.end = end_process;
  thread_ = std::thread([this] { run(); });
}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StallWatchdog::run() {
  bool ask_peers = false;
  try {
    if (watch_.on_start) watch_.on_start();
    ask_peers = mpi_from_any_thread();
  } catch (const std::exception& e) {
    watch_.end("watchdog of " + watch_.what() + ": " + e.what());
    return;
  }
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, kTick, [this] { return stopping_; })) return;
    }
    const CommunicatorState state = watch_.look();
    // While the communicator waits, its rank's other threads may be stuck inside it: this one
    // tells the ranks that ask, and is asked in turn while it names the silent ones below. While
    // it is idle, only the rank's own waits answer, so that a rank hung in its own code stays
    // silent and is named.
    std::optional<peer_health::Waiting> waiting;
    if (state.kind != CommunicatorState::Kind::kIdle) {
      waiting.emplace(watch_.what);
      if (ask_peers) peer_health::answer();
    }
    const Verdict verdict_now = verdict(state, std::chrono::steady_clock::now());
    if (verdict_now == Verdict::kGoOn) continue;
    watch_.end(verdict_now == Verdict::kFailed ? state.error : late_message(ask_peers));
    return;
  }
}

StallWatchdog::Verdict StallWatchdog::verdict(const CommunicatorState& state,
                                              std::chrono::steady_clock::time_point now) {
  using Kind = CommunicatorState::Kind;
  auto late_since = [&](std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(now - since).count() > watch_.timeout_s ? Verdict::kLate : Verdict::kGoOn;
  };
  if (state.kind != Kind::kBusy) busy_since_ = {};
  switch (state.kind) {
    case Kind::kIdle: return Verdict::kGoOn;
    case Kind::kFailed: return Verdict::kFailed;
    case Kind::kUnfinished: return late_since(state.queued);
    case Kind::kBusy:
      if (busy_since_ == std::chrono::steady_clock::time_point{}) busy_since_ = now;
      return late_since(busy_since_);
  }
  return Verdict::kGoOn;
}

// Without MPI from this thread no rank can be asked, and none is named.
std::string StallWatchdog::late_message(bool ask_peers) const {
  if (ask_peers) return peer_health::timed_out(watch_.what(), watch_.world_ranks, watch_.timeout_s);
  return watch_.what() + " did not finish within comm.timeout_s = " + seconds_text(watch_.timeout_s) +
         ": a peer rank has died or hangs";
}

}  // namespace dstrain
