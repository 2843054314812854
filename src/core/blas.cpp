#include "dstrain/core/blas.h"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>

namespace dstrain::blas {
namespace {

// Looked up at run time: which BLAS is loaded is decided by the system, not at link time.
template <typename Function>
Function* find(const char* symbol) {
  return reinterpret_cast<Function*>(dlsym(RTLD_DEFAULT, symbol));
}

std::string resolved_path(const char* file) {
  char resolved[PATH_MAX];
  return realpath(file, resolved) ? std::string(resolved) : std::string(file);
}

}  // namespace

Library loaded() {
  Library library;
  void* gemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info{};
  if (gemm && dladdr(gemm, &info) != 0 && info.dli_fname) library.path = resolved_path(info.dli_fname);
  if (auto* config = find<char*()>("openblas_get_config")) {
    library.name = config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Haswell MAX_THREADS=64"
  } else if (library.path.find("/blas/libblas.so") != std::string::npos) {
    // Debian's package of the reference implementation installs it under .../blas/.
    library.name = "reference BLAS (netlib)";
    library.reference = true;
  } else {
    library.name = library.path.empty() ? "unknown BLAS" : library.path.substr(library.path.rfind('/') + 1);
  }
  return library;
}

void set_threads(int threads) {
  if (auto* set = find<void(int)>("openblas_set_num_threads")) set(threads);
}

}  // namespace dstrain::blas
