// SIGTERM and SIGUSR1, what Slurm sends before a time limit (--signal) or a preemption: the
// handler only notes the request; the trainer acts on it at the next step boundary, where every
// rank agrees, writes a checkpoint and exits with the "requeue me" code.
#pragma once

namespace dstrain::signals {

void install();
bool stop_requested();
const char* requested_by();  // "SIGTERM", "SIGUSR1", or ""

}  // namespace dstrain::signals
