// Where the log's lines go: straight to the stream, or, once write_in_background() is called,
// through a bounded queue to a thread of their own. A reader that stops reading (mpirun once it is
// signalled stops forwarding its ranks' output; a pipe nobody drains) then blocks only that
// thread, never training or its stop path: what does not fit in the queue is dropped and counted,
// and the count is written (to stderr) once the reader takes lines again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dstrain::log {

// `text` (whole lines, control characters included) onto `stream` (stdout or stderr), in the order
// of the calls.
void output(FILE* stream, const std::string& text);

// Waits until every queued line is written, or until the writer has written nothing for
// `stall_s` seconds (its reader has stopped reading). Whether everything was written.
bool drain(double stall_s);

// Lines dropped because the queue was full, since the process started.
int64_t dropped_lines();

// The seconds drain waits for a writer that writes nothing before it gives up.
constexpr double kDrainStallSeconds = 2.0;

// From now until the process ends, output() queues (up to kQueueBytes) and returns at once; the
// process's exit (from main or std::exit) first waits for the queue: drain(kDrainStallSeconds).
// Whoever ends the process otherwise (_Exit, MPI_Abort) drains first.
constexpr size_t kQueueBytes = size_t{1} << 20;
void write_in_background();

}  // namespace dstrain::log
