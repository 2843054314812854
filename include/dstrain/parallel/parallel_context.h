// MPI start-up and the communicators of this rank's groups in the parallel grid.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/parallel/compute_lane.h"
#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/parallel/parallel_grid.h"

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

// comm.backend auto resolved for a device: nccl on a GPU when dstrain has NCCL, else mpi.
// Throws Error(kUsage) for nccl on the CPU or in a build without NCCL.
Backend resolve_backend(Backend requested, const torch::Device& device);

// This rank's communicators: the world's, and one for each of its groups (parallel_grid.h), which
// the training code asks for by name. Groups of the same ranks share one communicator (with cp = 1
// the dp-cp group is the dp group; with ep = 1 the edp group is it too; every group of one rank
// is the rank alone), so that no collective needs a communicator of its own without a reason;
// the expert-parallel group, whose exchanges overlap the gradients' reduction, has its own.
class ParallelContext {
 public:
  // Collective over MPI_COMM_WORLD: every rank must call it with the same grid and backend (a
  // resolved one: mpi or nccl). `device` is this rank's.
  static ParallelContext create(const ParallelGrid& grid, Backend backend = Backend::kMpi,
                                const torch::Device& device = torch::kCPU, double timeout_s = 600);

  const ParallelGrid& grid() const { return grid_; }
  int world_rank() const { return world_rank_; }
  // Start-up agreements and small host-side exchanges (MPI whatever the backend).
  MpiCommunicator& world() const { return *world_; }
  Communicator& group(Group group) const;
  // The expert-parallel group, with the MPI backend's second communicator over its ranks for the
  // forward passes that DualPipeV's pairs run on a side lane (compute_lane.h) where there is one
  // (MPI with MPI_THREAD_MULTIPLE and ep > 1).
  LaneGroups expert_lanes() const { return LaneGroups(&group(Group::kEp), ep_side_.get()); }

  // Every kind of group with its size, on one line; with `ranks`, every group's members too, a
  // line per kind: what the start-up log says of the layout.
  std::string describe(bool ranks) const;

 private:
  ParallelContext(const ParallelGrid& grid, int world_rank) : grid_(grid), world_rank_(world_rank) {}

  ParallelGrid grid_;
  int world_rank_;
  std::unique_ptr<MpiCommunicator> world_;
  std::vector<std::unique_ptr<Communicator>> communicators_;  // one per distinct group of this rank
  std::map<Group, Communicator*> groups_;
  std::unique_ptr<Communicator> ep_side_;
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
