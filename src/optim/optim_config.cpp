#include "dstrain/optim/optim_config.h"

#include "dstrain/core/error.h"

namespace dstrain {

void add_optim_options(OptionTable& t) {
  t.add("optim.lr", OptionKind::kFloat, "3e-4", "peak learning rate, reached after the warmup");
  t.add("optim.min_lr", OptionKind::kFloat, "3e-5", "learning rate at the end of the cosine decay");
  t.add("optim.warmup_steps", OptionKind::kInt, "0", "steps of linear warmup to optim.lr (step s trains at optim.lr × s / warmup_steps)");
  t.add("optim.decay_steps", OptionKind::kInt, "0",
        "step at which the cosine decay reaches min_lr (0: train.steps)");
  t.add("optim.schedule_unit", OptionKind::kString, "steps",
        "what optim.warmup_steps and optim.decay_steps count: steps, or tokens in steps of train.global_batch × "
        "train.seq_len (with train.batch_rampup, whose early steps are smaller)");
  t.add("optim.beta1", OptionKind::kFloat, "0.9", "AdamW first-moment decay");
  t.add("optim.beta2", OptionKind::kFloat, "0.95", "AdamW second-moment decay");
  t.add("optim.eps", OptionKind::kFloat, "1e-8", "AdamW epsilon");
  t.add("optim.weight_decay", OptionKind::kFloat, "0.1",
        "decoupled weight decay (matrices only; never norms)");
  t.add("optim.grad_clip", OptionKind::kFloat, "1.0", "clip the global gradient norm to this (0: off)");
  t.add("optim.nonfinite", OptionKind::kString, "stop",
        "a step whose gradient norm is not finite changes nothing; then stop: end the run (exit code 6), "
        "or skip: go on, counting such steps (fp16 always skips, and backs off its loss scale)");
  t.add("optim.zero", OptionKind::kInt, "0",
        "ZeRO stage: 0 keeps the whole optimizer state on every data-parallel rank; 1 shards the fp32 "
        "master weights and AdamW moments over them (gradients reduce-scattered, parameters all-gathered)");
  t.add("optim.loss_scale", OptionKind::kFloat, "65536",
        "fp16 only: initial dynamic loss scale (halved on overflow, doubled after growth_interval clean steps)");
  t.add("optim.loss_scale_growth_interval", OptionKind::kInt, "1000",
        "fp16 only: clean steps after which the loss scale doubles");
}

const EnumNames<ScheduleUnit>& schedule_unit_names() {
  static const EnumNames<ScheduleUnit> names = {{"steps", ScheduleUnit::kSteps}, {"tokens", ScheduleUnit::kTokens}};
  return names;
}

OptimConfig read_optim_config(const Options& o) {
  OptimConfig c;
  c.lr = o.get_float("optim.lr", 0.0, 10.0);
  c.min_lr = o.get_float("optim.min_lr", 0.0, 10.0);
  c.warmup_steps = o.get_int("optim.warmup_steps", 0);
  c.decay_steps = o.get_int("optim.decay_steps", 0);
  c.schedule_unit = o.get_enum("optim.schedule_unit", schedule_unit_names());
  c.beta1 = o.get_float("optim.beta1", 0.0, 0.999999);
  c.beta2 = o.get_float("optim.beta2", 0.0, 0.999999);
  c.eps = o.get_float("optim.eps", 0.0, 1.0);
  if (c.eps <= 0)  // a parameter whose gradient is 0 would divide 0 by 0
    throw config_error("optim.eps", o.raw("optim.eps"),
                       "must be above 0: AdamW divides each step by sqrt(v) + eps, and v is 0 where a gradient is");
  c.weight_decay = o.get_float("optim.weight_decay", 0.0, 10.0);
  c.grad_clip = o.get_float("optim.grad_clip", 0.0, 1e9);
  c.skip_nonfinite = o.get_enum("optim.nonfinite", EnumNames<bool>{{"stop", false}, {"skip", true}});
  c.zero = static_cast<int>(o.get_int("optim.zero", 0, 1));
  c.loss_scale = o.get_float("optim.loss_scale", 1.0, 1e30);
  c.loss_scale_growth_interval = o.get_int("optim.loss_scale_growth_interval", 1);
  if (c.min_lr > c.lr)
    throw config_error("optim.min_lr", o.raw("optim.min_lr"),
                       "must not exceed optim.lr (" + o.raw("optim.lr") + ")");
  return c;
}

}  // namespace dstrain
