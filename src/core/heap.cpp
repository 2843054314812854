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

void keep_freed_memory() {
#if defined(__GLIBC__)
  // The heap's top goes back to the system only past 2 GiB free. A failure leaves the default,
  // which is correct, only slower.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

}  // namespace dstrain::heap
