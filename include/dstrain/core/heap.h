// How the C library's heap hands freed memory back to the system: at once for commands that
// stream tensors one at a time (ckpt import-hf and export-hf), whose peak memory must follow the
// largest tensor, not the sum of all of them; never for training on the CPU, which frees and
// allocates the same activations every step.
#pragma once

#include <cstddef>

namespace dstrain::heap {

// From here on every allocation of `bytes` or more gets a mapping of its own, unmapped when it is
// freed. glibc's default raises this threshold up to 32 MiB as large blocks are freed and serves
// smaller tensors from its heap, which, measured on an import of 1,667 tensors of a few MB each,
// kept growing instead of reusing what had been freed (peak RSS 16.5 GB for a 3.1 GB model).
// Nothing elsewhere than glibc.
void map_allocations_from(size_t bytes);

// From here on no allocation gets a mapping of its own and the heap keeps what is freed, to serve
// the next allocations. glibc maps every block above its threshold (32 MiB at most: a 100M
// model's logits, its embedding's gradient) and unmaps it when it is freed, so that each step
// faulted that memory in anew: measured on the CPU (bench/RESULTS.md), a third of a training
// step's time went to the kernel. Nothing elsewhere than glibc.
void keep_freed_memory();

}  // namespace dstrain::heap
