// Rank-aware logging. By default only world rank 0 prints, so a 1000-rank job reads like a
// 1-rank one; log.all_ranks makes every rank print with a "[rank N]" prefix, for debugging.
#pragma once

#include <sstream>
#include <string>

namespace dstrain::log {

void configure(int world_rank, int world_size, bool all_ranks);
bool is_printing_rank();

void write_info(const std::string& line);
void write_warning(const std::string& line);
// Errors are printed by whichever rank hit them: the rank that knows what went wrong says so.
void write_error(const std::string& line);

// A live status line (a progress bar) on a terminal: rewritten in place by each call, taken
// away before any other line is printed and drawn again after it, so that the two never mix.
// Only the printing rank draws it, and only when standard output is a terminal; "" removes it.
void set_status(const std::string& line);
bool stdout_is_terminal();

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
void info(const Args&... args) { write_info(concat(args...)); }
template <typename... Args>
void warning(const Args&... args) { write_warning(concat(args...)); }
template <typename... Args>
void error(const Args&... args) { write_error(concat(args...)); }

}  // namespace dstrain::log
