// The start of every multi-rank command that computes with the model (`train`, `eval`,
// `bench step`): the configuration, this rank's device and the rank grid's communicators, each
// phase agreed by every rank so that a failure on one ends all of them alike, with one message;
// and the policy for errors once the ranks are inside collectives.
#pragma once

#include <functional>
#include <optional>

#include "dstrain/core/error.h"
#include "dstrain/parallel/device.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

struct Job {
  int world_size = 1, world_rank = 0;
  TrainConfig config;
  DevicePlacement placement;
  std::optional<ParallelContext> parallel;  // set once the job has started
};

// `read_config` runs on every rank and may fail on any (a file only some ranks see); then the
// rank's torch threads and kernels are set, its device chosen, and the communicators built from
// parallel.order, dp and pp. Throws Error: the lowest failing rank's, or an empty one on the
// ranks that failed only because another did. Every phase is bounded (Deadline): the
// agreement on the configuration by `startup_timeout_s`, the rest by comm.timeout_s.
Job start_job(const std::function<TrainConfig(int world_size, int world_rank)>& read_config,
              double startup_timeout_s = 600);

// Reports `error` on this rank and ends every rank of the job with its exit code.
[[noreturn]] void abort_job(const Error& error);

// An error that every rank raises alike at the same point, after a last collective (the
// guards' stop on a non-finite step, decided from values reduced over all ranks): no rank waits
// for another, so the job ends as a failed start-up does, reported once.
class AgreedError : public Error {
 public:
  explicit AgreedError(const Error& error) : Error(error) {}
};
// Rank 0 reports `error`; once it has (a barrier: an exiting rank ends the job under mpirun),
// every rank throws it with an empty message, which main() leaves unprinted.
[[noreturn]] void end_agreed(const Job& job, const AgreedError& error);

// Runs `work` (collective: training, an evaluation) on a started job. An error during it is this
// rank's alone while the others wait inside collectives: the rank says what happened and ends
// the whole job (MPI_Abort with the error's exit code); a job of one rank throws it as it is.
// An AgreedError ends every rank without an abort (end_agreed).
template <typename Work>
auto run_or_abort(const Job& job, Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const AgreedError& agreed) {
    end_agreed(job, agreed);
  } catch (const std::exception& e) {
    const Error error = as_error(e);
    if (job.world_size == 1) throw error;
    abort_job(error);
  }
}

}  // namespace dstrain
