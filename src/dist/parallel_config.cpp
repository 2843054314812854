#include "dstrain/dist/parallel_config.h"

#include "dstrain/core/error.h"
#include "dstrain/dist/rank_grid.h"

namespace dstrain {

void add_parallel_options(OptionTable& t) {
  t.add("parallel.dp", OptionKind::kInt, "0", "data-parallel ranks (0: number of ranks / pp)");
  t.add("parallel.pp", OptionKind::kInt, "1", "pipeline-parallel stages");
  t.add("parallel.order", OptionKind::kString, "dp-pp",
        "grid order, innermost first: dp-pp keeps DP groups on consecutive ranks");
}

void add_comm_options(OptionTable& t) {
  t.add("comm.backend", OptionKind::kString, "auto",
        "collectives between ranks: nccl (GPUs), mpi (CPU, or GPUs through host memory), "
        "auto (nccl on GPUs when built with NCCL, else mpi)");
  t.add("comm.grad_dtype", OptionKind::kString, "fp32",
        "dtype gradients are reduced in: fp32, or bf16/fp16 to halve the traffic");
  t.add("comm.timeout_s", OptionKind::kFloat, "600",
        "a GPU collective that has not finished after this many seconds ends the job (exit code 5)");
}

ParallelConfig read_parallel_config(Options& o, int world_size) {
  ParallelConfig c;
  c.pp = static_cast<int>(o.get_int("parallel.pp", 1, INT32_MAX));
  if (c.pp != 1)
    throw config_error("parallel.pp", o.raw("parallel.pp"),
                       "pipeline parallelism is not available in this version; use 1");
  int64_t dp = o.get_int("parallel.dp", 0, INT32_MAX);
  if (dp == 0) {
    if (world_size % c.pp != 0)
      throw config_error("parallel.pp", o.raw("parallel.pp"),
                         "must divide the number of ranks (" + std::to_string(world_size) + ")");
    dp = world_size / c.pp;
    o.set("parallel.dp", std::to_string(dp));
  }
  c.dp = static_cast<int>(dp);
  c.order = o.get_string("parallel.order");
  RankGrid(world_size, c.dp, c.pp, c.order);  // validates dp × pp = world and the order
  return c;
}

CommConfig read_comm_config(const Options& o) {
  CommConfig c;
  c.backend = o.get_choice("comm.backend", {"auto", "mpi", "nccl"});
  c.grad_dtype = o.get_choice("comm.grad_dtype", {"fp32", "bf16", "fp16"});
  c.timeout_s = o.get_float("comm.timeout_s", 1.0, 1e7);
  return c;
}

}  // namespace dstrain
