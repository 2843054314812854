// Every MPI call goes through MPI_CHECK: a failure becomes an Error with the communication exit
// code, naming the call and MPI's own description of what went wrong.
#pragma once

#include <mpi.h>

#include <string>

#include "dstrain/core/error.h"

namespace dstrain {

[[noreturn]] void throw_mpi_error(int status, const char* call, const char* file, int line);

}  // namespace dstrain

#define MPI_CHECK(call)                                                       \
  do {                                                                        \
    int mpi_check_status_ = (call);                                           \
    if (mpi_check_status_ != MPI_SUCCESS)                                     \
      ::dstrain::throw_mpi_error(mpi_check_status_, #call, __FILE__, __LINE__); \
  } while (0)
