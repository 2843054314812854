#include "dstrain/parallel/parallel_config.h"

#include "dstrain/core/error.h"
#include "dstrain/parallel/rank_grid.h"

namespace dstrain {

void add_parallel_options(OptionTable& t) {
  t.add("parallel.dp", OptionKind::kInt, "0", "data-parallel ranks (0: number of ranks / pp)");
  t.add("parallel.pp", OptionKind::kInt, "1", "pipeline-parallel stages");
  t.add("parallel.ep", OptionKind::kInt, "1",
        "expert-parallel ranks: each MoE layer's routed experts are split over this many data-parallel ranks "
        "(must divide parallel.dp and model.n_routed_experts)");
  t.add("parallel.order", OptionKind::kString, "dp-pp",
        "grid dimensions, innermost (consecutive ranks) first: dp-pp keeps data-parallel groups on consecutive "
        "ranks, pp-dp pipeline groups; expert parallelism lies inside dp, its innermost part");
  t.add("parallel.schedule", OptionKind::kString, "1f1b",
        "pipeline schedule: gpipe, 1f1b, interleaved (1F1B over virtual_stages chunks per stage), or the "
        "zero-bubble zb-h1, zbv and dualpipev (zbv and dualpipev: 2 chunks per stage in a V; comm.backend mpi)");
  t.add("parallel.dualpipe_overlap", OptionKind::kBool, "false",
        "dualpipev with expert parallelism: each pair's forward runs on a second thread beside the paired "
        "backward, so that one micro-batch's expert all-to-all waits while the other computes (CPU with the MPI "
        "backend; it pays where ranks have cores to spare; on GPUs the pairs run one after the other)");
  t.add("parallel.virtual_stages", OptionKind::kInt, "0",
        "model chunks per pipeline stage (interleaved: 2 or more; zbv and dualpipev: 2; 0: what the schedule "
        "needs, 2 for interleaved, zbv and dualpipev, 1 for the others)");
  t.add("parallel.stage_layers", OptionKind::kString, "",
        "layers of each virtual stage, e.g. 9,8,8,7 (empty: balanced by FLOPs, the LM head counted)");
}

void add_comm_options(OptionTable& t) {
  t.add("comm.backend", OptionKind::kString, "auto",
        "collectives between ranks: nccl (GPUs), mpi (CPU, or GPUs through host memory), "
        "auto (nccl on GPUs when built with NCCL, else mpi)");
  t.add("comm.grad_dtype", OptionKind::kString, "fp32",
        "dtype gradients are reduced in: fp32; bf16/fp16 to halve the traffic; int8 or fp8 (E4M3) in blocks of 256 "
        "with an fp32 scale each, about a quarter, exchanged after the backward pass");
  t.add("comm.error_feedback", OptionKind::kBool, "false",
        "comm.grad_dtype = int8 or fp8: each rank adds what quantizing its gradient lost to its next step's "
        "gradient (checkpointed)");
  t.add("comm.bucket_mb", OptionKind::kFloat, "25",
        "gradients are averaged over the data-parallel group in buckets of this many MB (of fp32)");
  t.add("comm.overlap", OptionKind::kBool, "true",
        "start each bucket's average as soon as its gradients are complete, during the backward pass");
  t.add("comm.progress_thread", OptionKind::kBool, "true",
        "MPI backend: a thread keeps started buckets and sends moving while the rank computes (needs "
        "MPI_THREAD_MULTIPLE; without it, or off, they move when the rank polls them)");
  t.add("comm.timeout_s", OptionKind::kFloat, "600",
        "a collective, transfer or start-up phase (MPI_Init, the communicators' set-up) that has not finished "
        "after this many seconds ends the job (exit code 5)");
}

ParallelConfig read_parallel_config(Options& o, int world_size) {
  ParallelConfig c;
  c.pp = static_cast<int>(o.get_int("parallel.pp", 1, INT32_MAX));
  c.schedule = o.get_choice("parallel.schedule", {"gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev"});
  c.virtual_stages = static_cast<int>(o.get_int("parallel.virtual_stages", 0, 1024));  // 0: train's config sets it
  c.dualpipe_overlap = o.get_bool("parallel.dualpipe_overlap");
  const std::string layers = o.get_string("parallel.stage_layers");
  if (!layers.empty() && !parse_integer_list(layers, &c.stage_layers))
    throw config_error("parallel.stage_layers", layers, "expected layer counts separated by commas, e.g. 9,8,8,7");
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
  c.ep = static_cast<int>(o.get_int("parallel.ep", 1, INT32_MAX));
  if (c.dp % c.ep != 0)
    throw config_error("parallel.ep", o.raw("parallel.ep"),
                       "must divide parallel.dp = " + std::to_string(c.dp) +
                           ": expert-parallel groups are carved out of the data-parallel ranks");
  return c;
}

void check_expert_parallelism(const ParallelConfig& c, int64_t routed_experts) {
  if (c.ep == 1) return;
  if (routed_experts == 0)
    throw config_error("parallel.ep", std::to_string(c.ep), "the model has no routed experts (a dense model); use 1");
  if (routed_experts % c.ep != 0)
    throw config_error("parallel.ep", std::to_string(c.ep),
                       "must divide model.n_routed_experts = " + std::to_string(routed_experts) +
                           ", so that every expert-parallel rank holds as many experts");
}

CommConfig read_comm_config(const Options& o) {
  CommConfig c;
  c.backend = o.get_choice("comm.backend", {"auto", "mpi", "nccl"});
  c.grad_dtype = o.get_choice("comm.grad_dtype", {"fp32", "bf16", "fp16", "int8", "fp8"});
  c.error_feedback = o.get_bool("comm.error_feedback");
  if (c.error_feedback && c.grad_dtype != "int8" && c.grad_dtype != "fp8")
    throw config_error("comm.error_feedback", o.raw("comm.error_feedback"),
                       "carries quantization error, and comm.grad_dtype = " + c.grad_dtype +
                           " quantizes nothing; set comm.grad_dtype = int8 or fp8");
  c.timeout_s = o.get_float("comm.timeout_s", 1.0, 1e7);
  c.bucket_mb = o.get_float("comm.bucket_mb", 0.001, 1e6);
  c.overlap = o.get_bool("comm.overlap");
  c.progress_thread = o.get_bool("comm.progress_thread");
  return c;
}

}  // namespace dstrain
