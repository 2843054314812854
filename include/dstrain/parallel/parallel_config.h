// The [parallel] and [comm] sections: how many ranks form each dimension of the grid, in which
// order, and what carries their collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/core/config.h"

namespace dstrain {

struct ParallelConfig {
  int dp = 1;
  int pp = 1;
  // Expert parallelism: each MoE layer's routed experts split over `ep` ranks of every
  // data-parallel group (consecutive data shards: ep rank = dp index % ep, the innermost part of
  // the data dimension), so that the token exchange stays among neighbouring ranks.
  int ep = 1;
  std::string order = "dp-pp";
  std::string schedule = "1f1b";      // gpipe | 1f1b | interleaved | zb-h1 | zbv | dualpipev
  int virtual_stages = 1;             // model chunks per pipeline stage (interleaved, zbv, dualpipev)
  bool dualpipe_overlap = false;      // dualpipev: a pair's forward and backward side by side
  std::vector<int64_t> stage_layers;  // layers per virtual stage; empty: balanced by cost
};

struct CommConfig {
  std::string backend = "auto";     // auto | mpi | nccl
  std::string grad_dtype = "fp32";  // dtype gradients are reduced in: fp32 | bf16 | fp16 | int8 | fp8
  bool error_feedback = false;      // int8/fp8: each rank carries its quantization error over
  double timeout_s = 600;
  double bucket_mb = 25;            // gradient buckets of the data-parallel average
  bool overlap = true;              // buckets start during the backward pass
  bool progress_thread = true;      // MPI: a thread moves nonblocking operations on (mpi_progress.h)
};

void add_parallel_options(OptionTable& table);
void add_comm_options(OptionTable& table);
// Resolves parallel.dp = 0 to world / pp (recording the result in `options`) and checks that the
// grid fills the world and that ep divides dp. Throws Error(kUsage) naming the key.
ParallelConfig read_parallel_config(Options& options, int world_size);
// parallel.ep against the model: it must have routed experts, and ep must divide their number.
void check_expert_parallelism(const ParallelConfig& parallel, int64_t routed_experts);
CommConfig read_comm_config(const Options& options);

}  // namespace dstrain
