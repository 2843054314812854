// What carries a group's operations (comm.backend).
#pragma once

#include "dstrain/core/config.h"

namespace dstrain {

// MPI (CPU, or GPUs through host memory) or NCCL (GPUs); auto is resolved at start-up
// (resolve_backend) and never names a communicator's.
enum class Backend { kAuto, kMpi, kNccl };
const EnumNames<Backend>& backend_names();  // auto, mpi, nccl

}  // namespace dstrain
