// What a run is about to do, as its start-up report tells a person: the model's size and cost,
// the device, the pipeline's split, the optimizer state, the batch and the data; and the figures
// throughput is judged by (FLOP per token, the devices' peak).
#pragma once

#include "dstrain/data/mixture.h"
#include "dstrain/parallel/device.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/train/stage_builder.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

struct RunPlan {
  double flops_per_token = 0;  // training: forward and backward
  double peak_flops = 0;       // of all devices together; 0: unknown
  std::string peak_described;  // where one device's peak comes from (core/device_peak.h)
};
RunPlan run_plan(const TrainConfig& config, const ParallelContext& parallel, const DevicePlacement& placement);

// The start-up report's lines (the reporting rank prints them).
void log_run_plan(const TrainConfig& config, const RunPlan& plan, const ParallelContext& parallel,
                  const DevicePlacement& placement, const RankStage& stage, const AdamW& optimizer, bool sharded,
                  const Mixture& train_data);

}  // namespace dstrain
