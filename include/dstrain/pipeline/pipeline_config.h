// The pipeline's part of the [parallel] section: the schedule, the model chunks each stage holds
// and how the layers are split between them. (The grid's sizes and order are parallel/'s.)
#pragma once

#include <cstdint>
#include <vector>

#include "dstrain/core/config.h"
#include "dstrain/pipeline/schedule.h"

namespace dstrain {

struct PipelineConfig {
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int virtual_stages = 1;             // model chunks per pipeline stage (resolved: never 0)
  bool dualpipe_overlap = false;      // dualpipev: a pair's forward and backward side by side
  std::vector<int64_t> stage_layers;  // layers per virtual stage; empty: balanced by cost
};

void add_pipeline_options(OptionTable& table);
// parallel.virtual_stages = 0 is resolved to the schedule's default and written back into
// `options`, so that config.ini records what ran. Throws Error(kUsage) naming the key.
PipelineConfig read_pipeline_config(Options& options);

}  // namespace dstrain
