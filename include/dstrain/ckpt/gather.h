// Brings the parameters of every pipeline stage to world rank 0 (each stage's data-parallel rank 0
// sends its own): what a single-file export of the whole model needs.
#pragma once

#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/parallel/parallel_context.h"

namespace dstrain {

// Collective over MPI_COMM_WORLD. On world rank 0: every parameter of the model, in its own
// dtype, on the CPU, sorted by name; elsewhere: empty.
NamedTensors gather_parameters(const NamedTensors& local, const ParallelContext& parallel);

}  // namespace dstrain
