// The run's last words: the "done" line, and on the reporting rank summary.json.
#pragma once

#include "dstrain/optim/adamw.h"
#include "dstrain/parallel/device.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/train/train_config.h"
#include "dstrain/train/trainer.h"

namespace dstrain {

void write_run_summary(const TrainConfig& config, const ParallelContext& parallel, const DevicePlacement& placement,
                       const AdamW& optimizer, const TrainResult& result, bool evaluated, double seconds);

}  // namespace dstrain
