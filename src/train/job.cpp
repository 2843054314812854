#include "dstrain/train/job.h"

#include "dstrain/core/blas.h"
#include "dstrain/core/heap.h"
#include "dstrain/core/log.h"
#include "dstrain/core/log_writer.h"
#include "dstrain/parallel/agreed_phase.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/parallel/deadline.h"
#include "dstrain/parallel/mpi_progress.h"

namespace dstrain {

Job start_job(const std::function<TrainConfig(int world_size, int world_rank)>& read_config,
              double startup_timeout_s) {
  Job job;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &job.world_size));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &job.world_rank));
  {
    Deadline deadline("the ranks' agreement on the configuration", startup_timeout_s, Deadline::kStartup,
                      ExitCode::kCommunication);
    agreed_phase(job.world_rank, [&] { job.config = read_config(job.world_size, job.world_rank); });  // this rank alone
  }
  Deadline deadline("the set-up of devices and communicators", job.config.comm.timeout_s, Deadline::kStartup,
                    ExitCode::kCommunication);
  mpi_progress::configure(job.config.comm.progress_thread);
  torch::set_num_threads(job.config.loop.threads);
  blas::set_threads(job.config.loop.threads);  // OpenBLAS's pool would otherwise take every core, on every rank
  Backend backend = Backend::kMpi;
  agreed_phase(job.world_rank, [&] {  // this rank's device (after one collective that cannot fail alone)
    job.placement = place_rank(job.config.loop.device);
    backend = resolve_backend(job.config.comm.backend, job.placement.device);
  });
  if (job.placement.device.is_cpu()) heap::keep_freed_memory();  // the activations come back every step
  agreed_phase(job.world_rank, [&] {  // collective: communicators (their checks fail on every rank alike)
    job.parallel.emplace(ParallelContext::create(ParallelGrid(job.config.parallel), backend, job.placement.device,
                                                 job.config.comm.timeout_s));
  });
  log::info(job.parallel->describe(job.config.log.rank_groups));
  return job;
}

void abort_job(const Error& error) {
  log::error(error.what());
  log::drain(log::kDrainStallSeconds);  // the message out first, unless nobody reads it
  MPI_Abort(MPI_COMM_WORLD, static_cast<int>(error.code()));
  std::abort();  // MPI_Abort does not return
}

void end_agreed(const Job& job, const AgreedError& error) {
  if (job.world_rank == 0) log::error(error.what());
  if (job.world_size > 1) job.parallel->world().barrier();
  throw Error(error.code(), "");
}

}  // namespace dstrain
