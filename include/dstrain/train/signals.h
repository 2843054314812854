// SIGTERM and SIGUSR1, what Slurm sends before a time limit (--signal) or a preemption, and
// SIGINT (Ctrl-C): the handler only notes the request; the trainer acts on it at the next step
// boundary, where every rank agrees, writes a checkpoint and exits with the "requeue me" code.
// A second SIGINT ends the process at once.
#pragma once

namespace dstrain::signals {

void install();
bool stop_requested();
const char* requested_by();  // "SIGTERM", "SIGUSR1", "SIGINT", or ""

}  // namespace dstrain::signals
