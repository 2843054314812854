#include "dstrain/parallel/parallel_context.h"

#include <hdf5.h>

#include <algorithm>
#include <climits>
#include <exception>
#include <optional>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/h5.h"
#include "dstrain/core/log.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/parallel/nccl_communicator.h"
#include "dstrain/parallel/peer_health.h"
#include "dstrain/parallel/deadline.h"
#include "dstrain/parallel/mpi_progress.h"

namespace dstrain {

MpiSession::MpiSession(int* argc, char*** argv, double startup_timeout_s)
    : uncaught_at_start_(std::uncaught_exceptions()) {
  int provided = 0;
  {
    Deadline deadline("MPI start-up (MPI_Init waits for every rank)", startup_timeout_s, Deadline::kStartup,
                      ExitCode::kCommunication);
    // MULTIPLE for the progress thread (mpi_progress.h) and DualPipeV's side lane (compute_lane.h);
    // FUNNELED is what the rest needs.
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  }
  if (provided < MPI_THREAD_FUNNELED)
    throw comm_error("the MPI library does not provide MPI_THREAD_FUNNELED");
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  Deadline deadline("MPI start-up (the ranks' host names)", startup_timeout_s, Deadline::kStartup,
                    ExitCode::kCommunication);
  peer_health::start();
}

MpiSession::~MpiSession() {
  if (std::uncaught_exceptions() > uncaught_at_start_) return;  // the catcher reports, then finalizes
  finalize_mpi();
}

void finalize_mpi() {
  int initialized = 0, finalized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  mpi_progress::stop();
  if (h5::holds_unclosable_file()) return;  // closing HDF5, here or in MPI_Finalize, would crash
  // Before MPI_Finalize, which would otherwise close HDF5 from inside MPI.
  if (H5close() < 0) log::warning("HDF5 could not close every file it held at exit");
  peer_health::stop();
  MPI_Finalize();
}

Backend resolve_backend(Backend requested, const torch::Device& device) {
#ifdef DSTRAIN_WITH_NCCL
  const bool have_nccl = true;
#else
  const bool have_nccl = false;
#endif
  if (requested == Backend::kAuto) return device.is_cuda() && have_nccl ? Backend::kNccl : Backend::kMpi;
  if (requested == Backend::kNccl && !have_nccl)
    throw config_error("comm.backend", "nccl",
                       "this dstrain was built without NCCL (it needs a LibTorch with CUDA and NCCL); use mpi");
  if (requested == Backend::kNccl && !device.is_cuda())
    throw config_error("comm.backend", "nccl", "NCCL needs GPUs; with train.device = cpu use mpi");
  return requested;
}

namespace {

// NCCL refuses two ranks of one communicator on the same GPU, and fails obscurely when it
// finds out. Checked over the whole world, so that every rank fails alike or none does.
void require_own_gpus(const torch::Device& device) {
  const std::string mine = accel::device_uuid(device.index());
  int size = 1;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  std::string all(mine.size() * static_cast<size_t>(size), '\0');
  MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(),
                          static_cast<int>(mine.size()), MPI_BYTE, MPI_COMM_WORLD));
  auto uuid_of = [&](int r) { return all.substr(r * mine.size(), mine.size()); };
  for (int a = 0; a < size; ++a)
    for (int b = a + 1; b < size; ++b)
      if (uuid_of(a) == uuid_of(b))
        throw config_error("comm.backend", "nccl",
                           "ranks " + std::to_string(a) + " and " + std::to_string(b) +
                               " share one GPU, which NCCL does not allow; give each rank its own GPU "
                               "or use comm.backend = mpi");
}

std::unique_ptr<Communicator> make_group(MPI_Comm comm, Backend backend, const torch::Device& device,
                                         double timeout_s) {
  if (backend == Backend::kMpi) return std::make_unique<MpiCommunicator>(comm, timeout_s);
#ifdef DSTRAIN_WITH_NCCL
  // NCCL keeps its own copy of the group; the MPI communicator is only needed to set it up.
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(comm, device, timeout_s);
  MPI_CHECK(MPI_Comm_free(&comm));
  return nccl;
#else
  (void)device;
  (void)timeout_s;
  throw Error(ExitCode::kInternal, "backend " + name_of(backend_names(), backend) + " is not compiled in");
#endif
}

// Builds the group `comm` on every rank, each rank learning whether every rank built it: a rank
// that failed does not leave the others waiting inside the next group's set-up.
std::unique_ptr<Communicator> agreed_group(MPI_Comm comm, Backend backend, const torch::Device& device,
                                           double timeout_s) {
  std::unique_ptr<Communicator> group;
  std::optional<Error> failure;
  try {
    group = make_group(comm, backend, device, timeout_s);
  } catch (const std::exception& e) {  // LibTorch's CUDA errors too: every rank must agree
    failure = as_error(e);
  }
  const FailureAgreement agreement = agree_on_failure(failure ? static_cast<int>(failure->code()) : 0);
  if (failure) throw *failure;
  if (agreement.exit_code != 0) throw Error(static_cast<ExitCode>(agreement.exit_code), "");
  return group;
}

// The MPI communicator of `rank`'s group among `groups` (every group of a kind): collective.
MPI_Comm split_off(const std::vector<std::vector<int>>& groups, int rank) {
  for (size_t colour = 0; colour < groups.size(); ++colour) {
    const auto place = std::find(groups[colour].begin(), groups[colour].end(), rank);
    if (place == groups[colour].end()) continue;
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(colour), static_cast<int>(place - groups[colour].begin()),
                             &comm));
    return comm;
  }
  throw Error(ExitCode::kInternal, "rank " + std::to_string(rank) + " is in no group of the grid");
}

}  // namespace

ParallelContext ParallelContext::create(const ParallelGrid& grid, Backend backend, const torch::Device& device,
                                        double timeout_s) {
  if (backend == Backend::kNccl) require_own_gpus(device);
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (size != grid.world())
    throw Error(ExitCode::kInternal,
                "a grid of " + std::to_string(grid.world()) + " ranks for " + std::to_string(size));
  ParallelContext context(grid, rank);
  MPI_Comm world = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  context.world_ = std::make_unique<MpiCommunicator>(world, timeout_s);
  // A kind whose groups are those of a kind made before shares its communicator (the same on
  // every rank: the groups are the grid's, not this rank's), except the expert exchange's: it runs
  // while the gradient buckets of the backward pass are under way, which with NCCL would queue it
  // behind them on a shared communicator's stream.
  std::vector<std::pair<std::vector<std::vector<int>>, Communicator*>> made;
  for (Group kind : every_group()) {
    std::vector<std::vector<int>> groups = grid.all(kind);
    const bool own = kind == Group::kEp && grid.size(kind) > 1;
    const auto same = std::find_if(made.begin(), made.end(), [&](const auto& m) { return m.first == groups; });
    if (!own && same != made.end()) {
      context.groups_[kind] = same->second;
      continue;
    }
    context.communicators_.push_back(agreed_group(split_off(groups, rank), backend, device, timeout_s));
    context.groups_[kind] = context.communicators_.back().get();
    made.emplace_back(std::move(groups), context.communicators_.back().get());
  }
  // MPI: a second communicator over the expert-parallel group for DualPipeV's side lane
  // (compute_lane.h), which calls MPI from a second thread.
  int thread_level = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&thread_level));
  if (backend == Backend::kMpi && thread_level == MPI_THREAD_MULTIPLE && grid.size(Group::kEp) > 1)
    context.ep_side_ = agreed_group(split_off(grid.all(Group::kEp), rank), backend, device, timeout_s);
  return context;
}

Communicator& ParallelContext::group(Group group) const { return *groups_.at(group); }

std::string ParallelContext::describe(bool ranks) const {
  std::string text = "groups (parallel.order " + grid_.order() + "):";
  for (Group kind : every_group()) text += " " + name_of(group_names(), kind) + " " + std::to_string(grid_.size(kind));
  if (!ranks) return text;
  for (Group kind : every_group()) {
    text += "\n  " + name_of(group_names(), kind) + ":";
    for (const std::vector<int>& members : grid_.all(kind)) {
      text += " [";
      for (size_t i = 0; i < members.size(); ++i) text += (i ? " " : "") + std::to_string(members[i]);
      text += "]";
    }
  }
  return text;
}

FailureAgreement agree_on_failure(int local_exit_code, bool has_message) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  // MAX of -rank = MIN rank: the lowest failing rank that has something to say.
  int mine[2] = {local_exit_code, local_exit_code != 0 && has_message ? -rank : INT_MIN};
  int agreed[2] = {0, INT_MIN};
  MPI_CHECK(MPI_Allreduce(mine, agreed, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return {agreed[0], agreed[0] != 0 && agreed[1] != INT_MIN ? -agreed[1] : -1};
}

}  // namespace dstrain
