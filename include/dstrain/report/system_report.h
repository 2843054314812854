// The start-up report of the machine and the libraries a run uses, for the log (and for a bug
// report): CPU model and cores, memory, GPUs with their memory, and the versions of LibTorch,
// MPI, NCCL, HDF5 and CUDA. Of the node of the calling rank; MPI must be initialised.
#pragma once

#include <string>

namespace dstrain {

std::string system_report();

}  // namespace dstrain
