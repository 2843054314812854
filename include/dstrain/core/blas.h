// The BLAS library LibTorch's CPU matrix products run on: whatever Debian's alternatives point
// libblas.so.3 at. The reference (netlib) BLAS, a fresh Debian's default, is an order of
// magnitude slower than OpenBLAS for the same results, so the start-up report names it, and
// OpenBLAS's own thread pool is limited like LibTorch's: the ranks already take the cores.
#pragma once

#include <string>

namespace dstrain::blas {

struct Library {
  std::string name;  // "OpenBLAS 0.3.21 ...", "reference BLAS (netlib)", or the library's file
  std::string path;  // the file it was loaded from, links resolved ("" when not found)
  bool reference = false;
};

// The library that provides sgemm_ in this process.
Library loaded();

// Threads of the BLAS library's own pool, where it has one (OpenBLAS); nothing otherwise.
void set_threads(int threads);

}  // namespace dstrain::blas
