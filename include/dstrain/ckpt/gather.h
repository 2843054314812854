// Brings every parameter of the model to world rank 0, whatever the layout: the first rank of
// each set of dense replicas (dp-cp) sends its replicated parameters, the first of each set of
// expert replicas (edp) its routed experts; under tensor parallelism each rank of a tp group its
// blocks of the split parameters, which rank 0 joins. What a single-file export of the whole
// model needs.
#pragma once

#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/parallel/parallel_grid.h"

namespace dstrain {

// Collective over `world` (every rank of `grid`). On world rank 0: every parameter of the model,
// in its own dtype, on the CPU, sorted by name; elsewhere: empty.
NamedTensors gather_parameters(const NamedTensors& local, MpiCommunicator& world, const ParallelGrid& grid);

}  // namespace dstrain
