#include "dstrain/core/heap.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <climits>

namespace dstrain::heap {

void map_allocations_from(size_t bytes) {
#if defined(__GLIBC__)
  // Setting the threshold also turns off glibc's raising of it. A failure leaves the default,
  // which is correct, only hungrier.
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes < static_cast<size_t>(INT_MAX) ? bytes : INT_MAX));
#else
  (void)bytes;
#endif
}

}  // namespace dstrain::heap
