// A watch, from a thread of its own, on a communicator whose operations are queued on a device
// (NCCL): a hung operation stops the host only when it next waits for the device, and that may be
// inside any CUDA call that no timeout reaches. Every half second the watchdog asks the
// communicator how it stands and, while an operation waits, answers the ranks that ask who still
// answers (peer_health.h), saying what it waits for. An operation still unfinished
// comm.timeout_s after it was queued, or a call that has held the communicator that long, ends
// the process with exit code 5 after naming first the ranks that stopped answering, as the MPI
// backend's timeouts do (peer_health::timed_out); an asynchronous error ends it at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dstrain {

// How the watched communicator stands, as it tells the watchdog.
struct CommunicatorState {
  enum class Kind {
    kIdle,        // nothing unfinished
    kBusy,        // a call holds the communicator (creation, a queueing call): the watchdog times it
    kUnfinished,  // an operation queued at `queued` has not finished
    kFailed,      // an asynchronous error: `error`
  };
  Kind kind = Kind::kIdle;
  std::chrono::steady_clock::time_point queued{};
  std::string error;
};

struct StallWatch {
  // What the communicator does, for a stall's report and the peers that ask: "an NCCL operation on
  // 4 ranks (...)"; from the watchdog's thread.
  std::function<std::string()> what;
  std::vector<int> world_ranks;  // the communicator's members
  double timeout_s = 600;        // comm.timeout_s
  std::function<CommunicatorState()> look;  // from the watchdog's thread; must not block
  // Once, on the watchdog's thread before its first look (the thread's current GPU).
  std::function<void()> on_start;
  // What ends the watch: by default, logs `why` and ends the process with exit code 5.
  std::function<void(const std::string& why)> end;
};

class StallWatchdog {
 public:
  explicit StallWatchdog(StallWatch watch);
  ~StallWatchdog();  // stops and joins the thread
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

 private:
  enum class Verdict { kGoOn, kLate, kFailed };

  void run();
  // Why the watch ends (a stall, an asynchronous error), or nothing when it was stopped.
  std::optional<std::string> watch_until_stopped();
  Verdict verdict(const CommunicatorState& state, std::chrono::steady_clock::time_point now);

  StallWatch watch_;
  std::chrono::steady_clock::time_point busy_since_{};  // when a look first found the communicator held
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dstrain
