#include "dstrain/parallel/stall_watchdog.h"

#include <cstdlib>
#include <optional>

#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/core/log_writer.h"
#include "dstrain/parallel/peer_health.h"

namespace dstrain {
namespace {

constexpr auto kTick = std::chrono::milliseconds(500);

void end_process(const std::string& why) {
  log::error(why, "; ending this rank (exit code 5)");
  log::drain(log::kDrainStallSeconds);
  std::_Exit(static_cast<int>(ExitCode::kCommunication));
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
  // A failure here (setting the GPU, an MPI call while answering) ends the watch, never the
  // process through an exception no one catches.
  try {
    if (watch_.on_start) watch_.on_start();
    if (const std::optional<std::string> why = watch_until_stopped()) watch_.end(*why);
  } catch (const std::exception& e) {
    watch_.end("watchdog of " + watch_.what() + ": " + e.what());
  }
}

std::optional<std::string> StallWatchdog::watch_until_stopped() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, kTick, [this] { return stopping_; })) return std::nullopt;
    }
    const CommunicatorState state = watch_.look();
    // While the communicator waits, its rank's other threads may be stuck inside it: this one
    // tells the ranks that ask, and is asked in turn while it names the silent ones below. While
    // it is idle, only the rank's own waits answer, so that a rank hung in its own code stays
    // silent and is named.
    std::optional<peer_health::Waiting> waiting;
    if (state.kind != CommunicatorState::Kind::kIdle) {
      waiting.emplace(watch_.what);
      peer_health::answer();
    }
    switch (verdict(state, std::chrono::steady_clock::now())) {
      case Verdict::kGoOn: continue;
      case Verdict::kFailed: return state.error;
      case Verdict::kLate: return peer_health::timed_out(watch_.what(), watch_.world_ranks, watch_.timeout_s);
    }
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

}  // namespace dstrain
