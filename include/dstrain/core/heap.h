// How the C library's heap hands freed memory back to the system, for commands that stream
// tensors one at a time (ckpt import-hf and export-hf): their peak memory must follow the largest
// tensor, not the sum of all of them.
#pragma once

#include <cstddef>

namespace dstrain::heap {

// From here on every allocation of `bytes` or more gets a mapping of its own, unmapped when it is
// freed. glibc's default raises this threshold up to 32 MiB as large blocks are freed and serves
// smaller tensors from its heap, which, measured on an import of 1,667 tensors of a few MB each,
// kept growing instead of reusing what had been freed (peak RSS 16.5 GB for a 3.1 GB model).
// Nothing elsewhere than glibc.
void map_allocations_from(size_t bytes);

}  // namespace dstrain::heap
