#include "dstrain/core/log_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

namespace dstrain::log {
namespace {

struct Queue {
  std::mutex mutex;
  std::condition_variable queued, wrote;
  std::deque<std::pair<FILE*, std::string>> lines;
  size_t bytes = 0;              // in `lines`
  bool background = false;       // output() queues
  bool writing = false;          // the thread is inside a write
  int64_t dropped_unreported = 0, dropped_total = 0;
  uint64_t writes = 0;           // finished, for drain's view of headway
};

// Never destroyed: at exit the thread may still be blocked in a write to a reader that is gone,
// and must not find its queue pulled from under it.
Queue& queue() {
  static Queue& q = *new Queue;
  return q;
}

// Straight to the file descriptor, past stdio: a write blocked on a reader that is gone then
// holds no stdio lock, which the process's exit (flushing every stream) would wait for forever.
// A failing write drops the rest of the text: there is nobody to tell.
void write_out(FILE* stream, const std::string& text) {
  const int fd = fileno(stream);
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void write_queued_lines() {
  Queue& q = queue();
  std::unique_lock<std::mutex> lock(q.mutex);
  for (;;) {
    q.queued.wait(lock, [&] { return !q.lines.empty(); });
    std::pair<FILE*, std::string> next = std::move(q.lines.front());
    q.lines.pop_front();
    q.bytes -= next.second.size();
    const int64_t dropped = std::exchange(q.dropped_unreported, 0);
    q.writing = true;
    lock.unlock();
    if (dropped > 0)
      write_out(stderr, "warning: " + std::to_string(dropped) +
                            " log line(s) dropped: the output was not being read (a stopped reader or a full pipe)\n");
    write_out(next.first, next.second);
    lock.lock();
    q.writing = false;
    ++q.writes;
    q.wrote.notify_all();
  }
}

}  // namespace

void output(FILE* stream, const std::string& text) {
  Queue& q = queue();
  std::unique_lock<std::mutex> lock(q.mutex);
  if (!q.background) {
    std::fflush(stream);      // what others wrote through stdio first
    write_out(stream, text);  // under the lock: in order with the queue's last lines
    return;
  }
  if (q.bytes + text.size() > kQueueBytes) {
    ++q.dropped_unreported;
    ++q.dropped_total;
    return;
  }
  q.bytes += text.size();
  q.lines.emplace_back(stream, text);
  q.queued.notify_one();
}

bool drain(double stall_s) {
  Queue& q = queue();
  std::unique_lock<std::mutex> lock(q.mutex);
  const auto stall = std::chrono::duration<double>(stall_s);
  while (!q.lines.empty() || q.writing) {
    const uint64_t writes = q.writes;
    if (!q.wrote.wait_for(lock, stall, [&] { return q.writes != writes; })) return false;
  }
  return true;
}

int64_t dropped_lines() {
  std::lock_guard<std::mutex> lock(queue().mutex);
  return queue().dropped_total;
}

void write_in_background() {
  std::fflush(nullptr);  // what stdio holds first
  Queue& q = queue();
  std::lock_guard<std::mutex> lock(q.mutex);
  if (q.background) return;
  std::thread(write_queued_lines).detach();  // lives as long as the process (see queue())
  std::atexit([] { drain(kDrainStallSeconds); });
  q.background = true;
}

}  // namespace dstrain::log
