// Everything `dstrain train` reads: the option table of every module and the typed, checked
// configuration of one run.
#pragma once

#include <cstdint>
#include <string>

#include "dstrain/ckpt/ckpt_config.h"
#include "dstrain/core/config.h"
#include "dstrain/core/torch_api.h"
#include "dstrain/data/batch_rampup.h"
#include "dstrain/parallel/parallel_config.h"
#include "dstrain/model/fp8_recipe.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/recompute.h"
#include "dstrain/optim/optim_config.h"
#include "dstrain/parallel/device.h"
#include "dstrain/pipeline/pipeline_config.h"
#include "dstrain/train/step_profiler_config.h"

namespace dstrain {

struct RunConfig {
  std::string dir;
  uint64_t seed = 0;
};

// train.precision's names: fp32, bf16, fp16.
const EnumNames<torch::ScalarType>& precision_names();

struct LoopConfig {
  int64_t steps = 0;
  int64_t micro_batch = 0;
  int64_t grad_accum = 0;   // resolved: never 0 after read_train_config
  int64_t global_batch = 0; // sequences per step: micro_batch × grad_accum × dp
  int64_t seq_len = 0;
  int64_t eval_interval = 0;
  int64_t eval_batches = 0;
  int threads = 1;
  DeviceRequest device = DeviceRequest::kAuto;
  torch::ScalarType precision = torch::kFloat32;  // of parameters and activations: fp32, bf16 or fp16
  double peak_tflops = 0;          // 0: known figures by GPU name
  Fp8Recipe fp8 = Fp8Recipe::kNone;  // the decoder layers' linear maps (model/fp8_recipe.h)
  bool cuda_kernels = true;        // dstrain's own, where built (model/cuda_kernels.h)
  bool grouped_experts = true;     // LibTorch's grouped product for routed experts (model/grouped_matmul.h)
  Recompute recompute = Recompute::kNone;
  int64_t recompute_layers = 0;    // full: the first N decoder layers of each model chunk; 0: all
  BatchRampup rampup;              // the global batch's ramp-up to global_batch (data/batch_rampup.h)
  // The global batch of a step that starts after `consumed` samples, and its micro-batches per rank.
  int64_t global_batch_after(int64_t consumed) const { return dstrain::global_batch_after(consumed, rampup, global_batch); }
  int64_t grad_accum_after(int64_t consumed) const { return grad_accum_for(global_batch_after(consumed)); }
  int64_t grad_accum_for(int64_t batch) const { return batch / (global_batch / grad_accum); }  // on this layout
};

struct DataConfig {
  std::string train, valid;
  int64_t prefetch = 4;
};

// Fault injection for tests (docs/checkpoints.md): rank fail_rank, at the start of step
// fail_at_step, kills itself (kill), kills itself while its checkpoint is being written
// (kill_in_save), signals itself SIGTERM (sigterm), stops answering (hang), or makes its
// gradients NaN (nan).
enum class FailMode { kKill, kKillInSave, kSigterm, kSigint, kHang, kNan };

struct DebugConfig {
  int64_t fail_at_step = 0;  // 0: never
  int fail_rank = 0;
  FailMode fail_mode = FailMode::kKill;
  bool forbid_host_sync = false;  // accel::HostSyncForbidden around each training step
  StepProfilerConfig profile;
};

struct LogConfig {
  int64_t interval = 1;
  bool all_ranks = false;
  bool rank_groups = false;  // the start-up log lists every group's ranks
};

struct TrainConfig {
  RunConfig run;
  ModelConfig model;
  ParallelConfig parallel;
  PipelineConfig pipeline;
  CommConfig comm;
  LoopConfig loop;
  OptimConfig optim;
  DataConfig data;
  CkptConfig ckpt;
  LogConfig log;
  DebugConfig debug;
};

// The whole option table of `dstrain train`, every section.
OptionTable train_option_table();

// Typed and checked; derived values (parallel.dp, train.grad_accum, train.global_batch,
// optim.decay_steps) are written back into `options` so that config.ini records what ran.
// Throws Error(kUsage) naming the key, its value and what is allowed.
TrainConfig read_train_config(Options& options, int world_size);
// Only the run, model, layout, communication, loop and optimizer sections, which need no file,
// and not the learning-rate schedule's fit to train.steps: what `dstrain model info` reads.
TrainConfig read_model_and_layout(Options& options, int world_size);

}  // namespace dstrain
