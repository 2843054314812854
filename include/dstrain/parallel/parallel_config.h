// The [parallel] and [comm] sections: how many ranks form each dimension of the grid
// (parallel_grid.h), in which order, and what carries their collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/core/config.h"
#include "dstrain/parallel/backend.h"

namespace dstrain {

struct ModelConfig;

struct ParallelConfig {
  int tp = 1;  // tensor parallelism
  bool sequence_parallel = false;  // with tp > 1: norms and residuals hold 1/tp of the sequence
  int cp = 1;  // context parallelism
  bool cp_latent = true;  // MLA passes its latent around the cp ring (else the per-head keys and values)
  int dp = 1;  // resolved: never 0 after read_parallel_config
  int pp = 1;
  // Expert parallelism: each MoE layer's routed experts split over `ep` ranks of the tp × cp × dp
  // ranks of a stage, the expert grid's innermost dimension by default.
  int ep = 1;
  std::string order = "tp-cp-ep-dp-pp";  // complete: every name, innermost first
};

// What gradients travel in between data-parallel ranks (comm.grad_dtype): a dtype, or 8-bit
// values in blocks with a scale each.
enum class GradientWire { kFp32, kBf16, kFp16, kInt8, kFp8 };
const EnumNames<GradientWire>& gradient_wire_names();  // fp32, bf16, fp16, int8, fp8

struct CommConfig {
  Backend backend = Backend::kAuto;
  GradientWire grad_dtype = GradientWire::kFp32;
  bool error_feedback = false;      // int8/fp8: each rank carries its quantization error over
  double timeout_s = 600;
  double bucket_mb = 25;            // gradient buckets of the data-parallel average
  bool overlap = true;              // buckets start during the backward pass
  bool progress_thread = true;      // MPI: a thread moves nonblocking operations on (mpi_progress.h)
};

void add_parallel_options(OptionTable& table);
void add_comm_options(OptionTable& table);
// Resolves parallel.dp = 0 to world / (tp × cp × pp) and completes parallel.order (recording both
// in `options`), and checks that the grids fill the world, that ep divides tp × cp × dp and that
// the order gives every rank one pipeline stage (parallel_grid.h). Throws Error(kUsage) naming the key.
ParallelConfig read_parallel_config(Options& options, int world_size);
// parallel.tp against the model and train.seq_len: it must divide the heads (and GQA's key-value
// heads), the vocabulary, the dense MLPs' and the shared experts' widths, and under sequence
// parallelism the sequence. Throws Error(kUsage) naming parallel.tp and the number.
void check_tensor_parallelism(const ParallelConfig& parallel, const ModelConfig& model, int64_t seq_len);
// parallel.cp against the model and train.seq_len: the sequence must split into 2 × cp chunks, at
// least as long as the multi-token prediction depths. Throws Error(kUsage) naming parallel.cp.
void check_context_parallelism(const ParallelConfig& parallel, const ModelConfig& model, int64_t seq_len);
// parallel.ep against the model: it must have routed experts, and ep must divide their number.
void check_expert_parallelism(const ParallelConfig& parallel, int64_t routed_experts);
CommConfig read_comm_config(const Options& options);

}  // namespace dstrain
