#include "dstrain/model/cuda_kernels.h"

#include <atomic>

namespace dstrain {
namespace {

std::atomic<bool> enabled{true};

}  // namespace

bool cuda_kernels_built() {
#ifdef DSTRAIN_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

void enable_cuda_kernels(bool on) { enabled = on; }

bool cuda_kernels_enabled() { return cuda_kernels_built() && enabled; }

}  // namespace dstrain
