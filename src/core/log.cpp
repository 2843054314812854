#include "dstrain/core/log.h"

#include "dstrain/core/log_writer.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace dstrain::log {
namespace {

int g_rank = 0, g_world_size = 1;
bool g_all_ranks = false;
std::mutex g_mutex;  // the prefetch thread may log too
std::string g_status;  // the live line on the terminal, "" when there is none

// "\r" returns to the line's start, "ESC [K" erases to its end: the status line disappears.
constexpr const char* kEraseStatus = "\r\033[K";

void emit(FILE* stream, const char* level, const std::string& line, bool force) {
  if (!force && !is_printing_rank()) return;
  // Which rank speaks matters only when there are several.
  const std::string prefix = (g_all_ranks || force) && g_world_size > 1 ? "[rank " + std::to_string(g_rank) + "] " : "";
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_status.empty()) output(stdout, kEraseStatus);
  output(stream, prefix + level + line + "\n");
  if (!g_status.empty()) output(stdout, g_status);
}

}  // namespace

void configure(int world_rank, int world_size, bool all_ranks) {
  g_rank = world_rank;
  g_world_size = world_size;
  g_all_ranks = all_ranks;
}

bool is_printing_rank() { return g_all_ranks || g_rank == 0; }

// Open MPI gives the ranks it starts a pseudo-terminal as standard output even when mpirun's own
// output goes to a file; then what mpirun writes to decides. It starts the ranks of its node
// itself, so on Linux that is its parent's standard output.
bool launcher_writes_to_terminal() {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return true;  // not started by Open MPI's mpirun
  char target[256];
  const std::string link = "/proc/" + std::to_string(getppid()) + "/fd/1";
  const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
  if (n <= 0) return false;  // cannot tell: no control characters, to be safe
  const std::string path(target, static_cast<size_t>(n));
  return path.rfind("/dev/pts/", 0) == 0 || path.rfind("/dev/tty", 0) == 0;
}

bool stdout_is_terminal() {
  static const bool terminal = [] {
    const char* term = std::getenv("TERM");
    return isatty(STDOUT_FILENO) == 1 && !(term && std::strcmp(term, "dumb") == 0) && launcher_writes_to_terminal();
  }();
  return terminal;
}

void set_status(const std::string& line) {
  if (g_rank != 0 || !stdout_is_terminal()) return;  // one bar per job, also with log.all_ranks
  std::lock_guard<std::mutex> lock(g_mutex);
  output(stdout, g_status.empty() ? line : kEraseStatus + line);
  g_status = line;
}

void write_info(const std::string& line) { emit(stdout, "", line, false); }
void write_warning(const std::string& line) { emit(stderr, "warning: ", line, false); }
void write_error(const std::string& line) { emit(stderr, "error: ", line, true); }

}  // namespace dstrain::log
