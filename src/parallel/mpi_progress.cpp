#include "dstrain/parallel/mpi_progress.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "dstrain/parallel/mpi_check.h"

namespace dstrain::mpi_progress {

struct Watched::State {
  MPI_Request request = MPI_REQUEST_NULL;
  bool done = false;
  int status = MPI_SUCCESS;  // of the test that failed, if one did
};

namespace {

// Long enough to leave the cores to the computation, short against a bucket's milliseconds.
constexpr std::chrono::microseconds kInterval{30};

struct Thread {
  std::mutex mutex;  // guards everything below and every test of a watched request
  std::condition_variable wake;
  std::vector<std::shared_ptr<Watched::State>> watched;
  std::thread thread;
  bool stopping = false;
};

// Never destroyed: a process that ends without stop() (an error that leaves MPI to the exit)
// must neither terminate on a joinable thread nor pull the mutex and list from under it.
Thread& progress() {
  static Thread& t = *new Thread;
  return t;
}

// Under the lock.
void test_locked(Watched::State& s) {
  if (s.done || s.status != MPI_SUCCESS) return;
  int flag = 0;
  s.status = MPI_Test(&s.request, &flag, MPI_STATUS_IGNORE);
  s.done = s.status == MPI_SUCCESS && flag != 0;
}

void run() {
  Thread& t = progress();
  std::unique_lock<std::mutex> lock(t.mutex);
  while (!t.stopping) {
    // Done, failed, or given up by their owner (only the thread holds them): nothing to move.
    t.watched.erase(std::remove_if(t.watched.begin(), t.watched.end(),
                                   [](const auto& s) { return s->done || s->status != MPI_SUCCESS || s.use_count() == 1; }),
                    t.watched.end());
    if (t.watched.empty()) {
      t.wake.wait(lock);
      continue;
    }
    for (const auto& s : t.watched) test_locked(*s);
    lock.unlock();
    std::this_thread::sleep_for(kInterval);
    lock.lock();
  }
}

}  // namespace

void configure(bool enabled) {
  int level = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&level));
  if (!enabled || level < MPI_THREAD_MULTIPLE) {
    stop();
    return;
  }
  Thread& t = progress();
  if (t.thread.joinable()) return;
  t.stopping = false;
  t.thread = std::thread(run);
}

void stop() {
  Thread& t = progress();
  if (!t.thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.stopping = true;
  }
  t.wake.notify_all();
  t.thread.join();
  t.watched.clear();
}

bool running() { return progress().thread.joinable(); }

Watched::Watched(MPI_Request request) : state_(std::make_shared<State>()) {
  state_->request = request;
  if (!running()) return;
  Thread& t = progress();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.watched.push_back(state_);
  }
  t.wake.notify_one();
}

Watched::~Watched() {
  // The thread drops it at its next round; the request itself belongs to the owner's operation.
  std::lock_guard<std::mutex> lock(progress().mutex);
  state_.reset();
}

bool Watched::test() {
  std::lock_guard<std::mutex> lock(progress().mutex);
  test_locked(*state_);
  if (state_->status != MPI_SUCCESS) throw_mpi_error(state_->status, "MPI_Test", __FILE__, __LINE__);
  return state_->done;
}

bool Watched::seen_complete() const {
  std::lock_guard<std::mutex> lock(progress().mutex);
  return state_->done;
}

}  // namespace dstrain::mpi_progress
