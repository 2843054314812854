#include "dstrain/parallel/parallel_context.h"

#include <hdf5.h>

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

std::string resolve_backend(const std::string& requested, const torch::Device& device) {
#ifdef DSTRAIN_WITH_NCCL
  const bool have_nccl = true;
#else
  const bool have_nccl = false;
#endif
  if (requested == "auto") return device.is_cuda() && have_nccl ? "nccl" : "mpi";
  if (requested == "nccl" && !have_nccl)
    throw config_error("comm.backend", requested,
                       "this dstrain was built without NCCL (it needs a LibTorch with CUDA and NCCL); use mpi");
  if (requested == "nccl" && !device.is_cuda())
    throw config_error("comm.backend", requested, "NCCL needs GPUs; with train.device = cpu use mpi");
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

std::unique_ptr<Communicator> make_group(MPI_Comm comm, const std::string& backend,
                                         const torch::Device& device, double timeout_s) {
  if (backend == "mpi") return std::make_unique<MpiCommunicator>(comm, timeout_s);
#ifdef DSTRAIN_WITH_NCCL
  // NCCL keeps its own copy of the group; the MPI communicator is only needed to set it up.
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(comm, device, timeout_s);
  MPI_CHECK(MPI_Comm_free(&comm));
  return nccl;
#else
  (void)device;
  (void)timeout_s;
  throw Error(ExitCode::kInternal, "backend " + backend + " is not compiled in");
#endif
}

}  // namespace

ParallelContext ParallelContext::create(const RankGrid& grid, const std::string& backend,
                                        const torch::Device& device, double timeout_s, int ep) {
  if (ep < 1 || grid.dp() % ep != 0)
    throw Error(ExitCode::kInternal, "expert-parallel size " + std::to_string(ep) + " does not divide dp");
  if (backend == "nccl") require_own_gpus(device);
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  GridCoord coord = grid.coord(rank);
  MPI_Comm world = MPI_COMM_NULL, dp = MPI_COMM_NULL, pp = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  // Ranks of one stage form a DP group, ordered by their data shard; and the other way round.
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, coord.pp, coord.dp, &dp));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, coord.dp, coord.pp, &pp));
  // One group after the other, each rank learning whether every rank built it: a rank that
  // failed does not leave the others waiting inside the next group's set-up.
  auto agreed_group = [&](MPI_Comm comm) {
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
  };
  std::unique_ptr<Communicator> dp_group = agreed_group(dp);
  std::unique_ptr<Communicator> pp_group = agreed_group(pp);
  ParallelContext context{grid, rank, coord, std::make_unique<MpiCommunicator>(world, timeout_s), std::move(dp_group),
                          std::move(pp_group), 1, nullptr, nullptr, nullptr};
  if (ep > 1) {
    // Colours unique over the world: (stage, expert-data index) and (stage, ep rank).
    const int expert_data_index = coord.dp / ep, ep_rank = coord.dp % ep;
    MPI_Comm ep_comm = MPI_COMM_NULL, expert_dp_comm = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, coord.pp * grid.dp() + expert_data_index, ep_rank, &ep_comm));
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, coord.pp * grid.dp() + ep_rank, expert_data_index, &expert_dp_comm));
    // MPI: a second communicator over the same ranks for DualPipeV's side lane (compute_lane.h),
    // which calls MPI from a second thread.
    int thread_level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&thread_level));
    const bool side_lane = backend == "mpi" && thread_level == MPI_THREAD_MULTIPLE;
    MPI_Comm ep_side_comm = MPI_COMM_NULL;
    if (side_lane) MPI_CHECK(MPI_Comm_dup(ep_comm, &ep_side_comm));
    context.ep = ep;
    context.ep_group = agreed_group(ep_comm);
    if (side_lane) context.ep_side_group = agreed_group(ep_side_comm);
    context.expert_dp_group = agreed_group(expert_dp_comm);
  }
  return context;
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
