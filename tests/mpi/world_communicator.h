// Every rank of the world as one group, on a communicator of its own (a duplicate of
// MPI_COMM_WORLD), as the tests of the model's groups take it.
#pragma once

#include <mpi.h>

#include <memory>
#include <stdexcept>

#include "dstrain/parallel/mpi_communicator.h"

namespace dstrain {

inline std::unique_ptr<MpiCommunicator> world_communicator() {
  MPI_Comm dup = MPI_COMM_NULL;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) throw std::runtime_error("MPI_Comm_dup failed");
  return std::make_unique<MpiCommunicator>(dup);
}

}  // namespace dstrain
