// The NCCL backend, compiled when LibTorch has CUDA and NCCL is found (DSTRAIN_WITH_NCCL).
#pragma once

#include <mpi.h>

#include <memory>

#include "dstrain/parallel/communicator.h"

namespace dstrain {

// Collective over `group` (an MPI communicator of the ranks that form this NCCL communicator):
// its first rank creates the ncclUniqueId and MPI broadcasts it. Every rank needs a GPU of its
// own (NCCL refuses two ranks on one GPU). An operation that has not finished `timeout_s` seconds
// after the last one was queued ends the job (exit code 5), wherever the host is waiting.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm group, const torch::Device& device,
                                                     double timeout_s);

}  // namespace dstrain
