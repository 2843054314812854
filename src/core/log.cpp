#include "dstrain/core/log.h"

#include <cstdio>
#include <mutex>

namespace dstrain::log {
namespace {

int g_rank = 0, g_world_size = 1;
bool g_all_ranks = false;
std::mutex g_mutex;  // the prefetch thread may log too

void emit(FILE* stream, const char* level, const std::string& line, bool force) {
  if (!force && !is_printing_rank()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  // Which rank speaks matters only when there are several.
  if ((g_all_ranks || force) && g_world_size > 1) std::fprintf(stream, "[rank %d] ", g_rank);
  std::fprintf(stream, "%s%s\n", level, line.c_str());
  std::fflush(stream);
}

}  // namespace

void configure(int world_rank, int world_size, bool all_ranks) {
  g_rank = world_rank;
  g_world_size = world_size;
  g_all_ranks = all_ranks;
}

bool is_printing_rank() { return g_all_ranks || g_rank == 0; }

void write_info(const std::string& line) { emit(stdout, "", line, false); }
void write_warning(const std::string& line) { emit(stderr, "warning: ", line, false); }
void write_error(const std::string& line) { emit(stderr, "error: ", line, true); }

}  // namespace dstrain::log
