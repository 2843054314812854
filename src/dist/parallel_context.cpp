#include "dstrain/dist/parallel_context.h"

#include "dstrain/dist/mpi_check.h"

#include <climits>

namespace dstrain {

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  if (provided < MPI_THREAD_FUNNELED)
    throw comm_error("the MPI library does not provide MPI_THREAD_FUNNELED");
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

ParallelContext ParallelContext::create(const RankGrid& grid) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  GridCoord coord = grid.coord(rank);
  MPI_Comm world = MPI_COMM_NULL, dp = MPI_COMM_NULL, pp = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  // Ranks of one stage form a DP group, ordered by their data shard; and the other way round.
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, coord.pp, coord.dp, &dp));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, coord.dp, coord.pp, &pp));
  return ParallelContext{grid, rank, coord, std::make_unique<MpiCommunicator>(world),
                         std::make_unique<MpiCommunicator>(dp), std::make_unique<MpiCommunicator>(pp)};
}

FailureAgreement agree_on_failure(int local_exit_code) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  int mine[2] = {local_exit_code, local_exit_code != 0 ? -rank : INT_MIN};  // MAX of -rank = MIN rank
  int agreed[2] = {0, INT_MIN};
  MPI_CHECK(MPI_Allreduce(mine, agreed, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return {agreed[0], agreed[0] != 0 ? -agreed[1] : -1};
}

}  // namespace dstrain
