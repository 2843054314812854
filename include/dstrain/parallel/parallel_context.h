// MPI start-up and the communicators of this rank's place in the DP × PP grid.
#pragma once

#include <memory>
#include <string>

#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/parallel/parallel_config.h"
#include "dstrain/parallel/rank_grid.h"

namespace dstrain {

// MPI_Init_thread on construction, finalize_mpi on destruction. The main thread calls MPI, and
// besides it only the progress thread (mpi_progress.h) and DualPipeV's side lane, on
// communicators of its own (compute_lane.h).
// Left by an exception, it does not finalize: whoever catches the error reports it first and then
// calls finalize_mpi, so that a failure in MPI's or HDF5's clean-up cannot swallow the message.
// MPI_Init waits for every rank: one that does not come within `startup_timeout_s` ends the job
// (Deadline).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv, double startup_timeout_s = 600);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }

 private:
  int rank_ = 0;
  int size_ = 1;
  int uncaught_at_start_ = 0;
};

// Closes what HDF5 still holds (a file a failed write left open, say) while MPI still runs, then
// MPI_Finalize; nothing when MPI was never initialised or is finalized already.
void finalize_mpi();

// comm.backend "auto" resolved for a device: nccl on a GPU when dstrain has NCCL, else mpi.
// Throws Error(kUsage) for nccl on the CPU or in a build without NCCL.
std::string resolve_backend(const std::string& requested, const torch::Device& device);

struct ParallelContext {
  RankGrid grid;
  int world_rank;
  GridCoord coord;
  std::unique_ptr<MpiCommunicator> world;  // start-up agreements and small host-side exchanges
  std::unique_ptr<Communicator> dp_group;  // same stage, every data shard
  std::unique_ptr<Communicator> pp_group;  // same data shard, every stage
  // Expert parallelism (ep > 1 only; nullptr otherwise): each data-parallel group splits into
  // groups of `ep` consecutive data shards, which hold one copy of the routed experts between
  // them and exchange tokens (ep_group, ordered by data shard: a member's rank is its ep rank);
  // the members that hold the same experts, one in each of those groups, average their
  // gradients (expert_dp_group, dp / ep ranks).
  int ep = 1;
  std::unique_ptr<Communicator> ep_group;
  // The MPI backend's second communicator over ep_group's ranks, for the forward passes that
  // DualPipeV's pairs run on a side thread (compute_lane.h); nullptr with NCCL, or where MPI
  // does not provide MPI_THREAD_MULTIPLE.
  std::unique_ptr<Communicator> ep_side_group;
  std::unique_ptr<Communicator> expert_dp_group;

  int ep_rank() const { return coord.dp % ep; }

  // Collective over MPI_COMM_WORLD: every rank must call it with the same grid, ep and backend
  // (a resolved one: "mpi" or "nccl"). `device` is this rank's. `ep` divides grid.dp().
  static ParallelContext create(const RankGrid& grid, const std::string& backend = "mpi",
                                const torch::Device& device = torch::kCPU, double timeout_s = 600, int ep = 1);
};

// After a phase in which any rank may fail on its own (opening files, say), every rank learns the
// worst exit code, so that nobody waits forever on a rank that has given up, and which rank
// should tell the user (the lowest failing one: one message, not one per rank).
struct FailureAgreement {
  int exit_code = 0;     // 0: every rank succeeded
  int reporter = -1;     // world rank that prints its message
};
// `has_message`: false for a rank that failed only because another did (and already knows it).
FailureAgreement agree_on_failure(int local_exit_code, bool has_message = true);

}  // namespace dstrain
