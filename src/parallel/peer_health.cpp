#include "dstrain/parallel/peer_health.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dstrain/parallel/mpi_check.h"

namespace dstrain::peer_health {
namespace {

constexpr int kPing = 1, kReply = 2;

struct State {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  std::vector<std::string> hosts;  // by world rank
  // Replies under way: their buffers live until MPI has sent them.
  std::deque<std::pair<MPI_Request, std::string>> replies;
  // Two threads may wait at once (DualPipeV's lanes, NCCL's autograd threads): one at a time
  // probes for pings, or both would take the same one and one would wait forever in its receive.
  std::recursive_mutex mutex;
  bool any_thread = false;  // MPI_THREAD_MULTIPLE: every thread may call MPI
};

// What this thread waits for: each lane answers with its own wait.
thread_local const std::function<std::string()>* waiting_for = nullptr;

State& state() {
  static State s;
  return s;
}

std::string this_host() {
  char host[256] = "unknown";
  if (gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

void forget_sent_replies() {
  State& s = state();
  while (!s.replies.empty()) {
    int done = 0;
    MPI_CHECK(MPI_Test(&s.replies.front().first, &done, MPI_STATUS_IGNORE));
    if (!done) return;
    s.replies.pop_front();
  }
}

// Below MPI_THREAD_MULTIPLE only the main thread may call MPI: another one neither answers nor asks.
bool this_thread_may_call_mpi() {
  if (state().any_thread) return true;
  int main_thread = 0;
  MPI_CHECK(MPI_Is_thread_main(&main_thread));
  return main_thread != 0;
}

std::string host_of(int world_rank) {
  const State& s = state();
  return world_rank < static_cast<int>(s.hosts.size()) ? s.hosts[static_cast<size_t>(world_rank)] : "?";
}

}  // namespace

void start() {
  State& s = state();
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm));
  MPI_CHECK(MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN));
  int size = 1;
  MPI_CHECK(MPI_Comm_rank(s.comm, &s.rank));
  MPI_CHECK(MPI_Comm_size(s.comm, &size));
  int level = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&level));
  s.any_thread = level == MPI_THREAD_MULTIPLE;
  // Every rank's host name, so that a silent rank can be named with its host.
  char mine[64] = {0};
  this_host().copy(mine, sizeof mine - 1);
  std::vector<char> all(sizeof mine * static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(mine, sizeof mine, MPI_CHAR, all.data(), sizeof mine, MPI_CHAR, s.comm));
  s.hosts.clear();  // (a second start, after a stop)
  for (int r = 0; r < size; ++r) s.hosts.emplace_back(all.data() + r * sizeof mine);
}

void stop() {
  State& s = state();
  if (s.comm == MPI_COMM_NULL) return;
  const std::lock_guard<std::recursive_mutex> lock(s.mutex);
  for (auto& reply : s.replies) MPI_Request_free(&reply.first);  // statuses ignored: at exit
  s.replies.clear();
  MPI_Comm_free(&s.comm);
}

Waiting::Waiting(const std::function<std::string()>& what) : previous_(waiting_for) { waiting_for = &what; }

Waiting::~Waiting() { waiting_for = previous_; }

void answer() {
  State& s = state();
  if (s.comm == MPI_COMM_NULL || !this_thread_may_call_mpi()) return;
  const std::unique_lock<std::recursive_mutex> lock(s.mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread of this rank is answering
  forget_sent_replies();
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kPing, s.comm, &arrived, &status));
    if (!arrived) return;
    MPI_CHECK(MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, kPing, s.comm, MPI_STATUS_IGNORE));
    s.replies.emplace_back(MPI_REQUEST_NULL, waiting_for ? "waiting in " + (*waiting_for)() : "computing");
    auto& [request, text] = s.replies.back();
    MPI_CHECK(MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, status.MPI_SOURCE, kReply, s.comm,
                        &request));
  }
}

std::string silent_ranks(const std::vector<int>& group, double grace_s) {
  State& s = state();
  if (s.comm == MPI_COMM_NULL || !this_thread_may_call_mpi()) return "";
  const std::lock_guard<std::recursive_mutex> lock(s.mutex);  // the replies are this thread's to take
  const int world = static_cast<int>(s.hosts.size());
  std::vector<MPI_Request> pings;
  std::map<int, std::string> said;  // by world rank: what the rank replied
  for (int other = 0; other < world; ++other) {
    if (other == s.rank) continue;
    pings.emplace_back();
    MPI_CHECK(MPI_Isend(nullptr, 0, MPI_BYTE, other, kPing, s.comm, &pings.back()));
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (said.size() < pings.size() && std::chrono::steady_clock::now() < until) {
    answer();  // others whose waits timed out ask this rank too
    int arrived = 0;
    MPI_Status status;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kReply, s.comm, &arrived, &status));
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    int length = 0;
    MPI_CHECK(MPI_Get_count(&status, MPI_CHAR, &length));
    std::string text(static_cast<size_t>(length), '\0');
    MPI_CHECK(MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, kReply, s.comm, MPI_STATUS_IGNORE));
    said[status.MPI_SOURCE] = text;
  }
  for (MPI_Request& ping : pings) MPI_Request_free(&ping);  // a silent rank never takes its ping
  auto who = [](int rank) { return "world rank " + std::to_string(rank) + " (host " + host_of(rank) + ")"; };
  std::string silent, others;
  for (int other = 0; other < world; ++other)
    if (other != s.rank && !said.count(other)) silent += (silent.empty() ? "" : ", ") + who(other);
  int listed = 0;
  for (int member : group)
    if (said.count(member) && listed++ < 8) others += "; " + who(member) + " was " + said[member];
  if (silent.empty()) return "";
  return silent + " did not answer within " + std::to_string(static_cast<int>(grace_s)) +
         " s: stopped, hung outside communication, or dead" + others;
}

std::string timed_out(const std::string& what, const std::vector<int>& group, double timeout_s) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g s", timeout_s);
  const std::string late = what + " did not finish within comm.timeout_s = " + seconds;
  // The silent member first: the line a user reads should name the rank that stopped, not this one.
  const std::string silent = silent_ranks(group, std::clamp(timeout_s / 10, 2.0, 30.0));
  if (silent.empty()) return late + ": a peer rank has died or hangs";
  return silent + ". This rank's " + late;
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_CHECK(MPI_Comm_group(comm, &group));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> mine(static_cast<size_t>(size)), world_ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) mine[static_cast<size_t>(r)] = r;
  MPI_CHECK(MPI_Group_translate_ranks(group, size, mine.data(), world, world_ranks.data()));
  MPI_CHECK(MPI_Group_free(&group));
  MPI_CHECK(MPI_Group_free(&world));
  return world_ranks;
}

std::string describe_group(const std::vector<int>& world_ranks) {
  std::string ranks;
  for (size_t i = 0; i < world_ranks.size() && i < 8; ++i) ranks += (i ? "," : "") + std::to_string(world_ranks[i]);
  if (world_ranks.size() > 8) ranks += ",...";
  return std::to_string(world_ranks.size()) + " ranks (world ranks " + ranks + ")";
}

}  // namespace dstrain::peer_health
