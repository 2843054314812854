#include "dstrain/core/log.h"

#include <cstdio>
#include <mutex>

namespace dstrain::log {
namespace {

int g_rank = 0;
bool g_all_ranks = false;
std::mutex g_mutex;  // the prefetch thread may log too

void emit(FILE* stream, const char* level, const std::string& line, bool force) {
  if (!force && !is_printing_rank()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_all_ranks || force) std::fprintf(stream, "[rank %d] ", g_rank);
  std::fprintf(stream, "%s%s\n", level, line.c_str());
  std::fflush(stream);
}

}  // namespace

void configure(int world_rank, bool all_ranks) {
  g_rank = world_rank;
  g_all_ranks = all_ranks;
}

bool is_printing_rank() { return g_all_ranks || g_rank == 0; }

void write_info(const std::string& line) { emit(stdout, "", line, false); }
void write_warning(const std::string& line) { emit(stderr, "warning: ", line, false); }
void write_error(const std::string& line) { emit(stderr, "error: ", line, true); }

}  // namespace dstrain::log
