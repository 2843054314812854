// The [optim] section: AdamW, the learning-rate schedule, gradient clipping and fp16 loss scaling.
#pragma once

#include <cstdint>
#include <string>

#include "dstrain/core/config.h"

namespace dstrain {

// What optim.warmup_steps and optim.decay_steps count: steps, or tokens in steps of the full batch.
enum class ScheduleUnit { kSteps, kTokens };
const EnumNames<ScheduleUnit>& schedule_unit_names();  // steps, tokens

struct OptimConfig {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // 0: train.steps
  ScheduleUnit schedule_unit = ScheduleUnit::kSteps;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables clipping
  bool skip_nonfinite = false;  // go on after a step with a non-finite gradient norm (else stop)
  int zero = 0;  // 1: ZeRO-1, optimizer state sharded over the data-parallel ranks
  double loss_scale = 65536;  // fp16: initial dynamic loss scale
  int64_t loss_scale_growth_interval = 1000;
};

void add_optim_options(OptionTable& table);
OptimConfig read_optim_config(const Options& options);

}  // namespace dstrain
