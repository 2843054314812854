// What may bend or stop a run between and inside steps, in one place: steps whose gradient norm
// is not finite (skipped on the device, judged at each log step and before each checkpoint),
// fp16's dynamic loss scale, the faults tests inject (debug.fail_*), and stop requests by signal.
#pragma once

#include "dstrain/core/torch_api.h"

#include <memory>

#include "dstrain/parallel/parallel_context.h"
#include "dstrain/optim/loss_scaler.h"
#include "dstrain/report/step_report.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

class StepGuards {
 public:
  StepGuards(const TrainConfig& config, ParallelContext& parallel, const torch::Device& device);
  StepGuards(const StepGuards&) = delete;  // loss_scale_fields() holds on to this one
  StepGuards& operator=(const StepGuards&) = delete;
  // A resumed run: the first check covers the steps after `step`.
  void continue_after(int64_t step) { last_checked_step_ = step; }

  // fp16's dynamic loss scaler; null in fp32 and bf16 runs.
  DynamicLossScaler* loss_scaler() const { return loss_scaler_.get(); }
  // What multiplies the step's losses before its backward pass: the fp16 loss scale, NaN when
  // a test makes this rank's gradients NaN (debug.fail_mode = nan); undefined otherwise.
  torch::Tensor backward_scale(int64_t step) const;
  // Counts the step when `grad_norm` is not finite. Returns the optimizer's skip flag: a 0-dim
  // fp32 tensor on the device, 1 for such a step. No synchronisation.
  torch::Tensor record_step(const torch::Tensor& grad_norm);

  // The log step: a non-finite mean loss ends the run unless non-finite steps are skipped;
  // then check_steps.
  void check_logged_loss(int64_t step, double loss);
  // Ends the run (exit code 6) when a step since the last check had a non-finite gradient norm
  // (optim.nonfinite = skip warns instead; fp16 skips them and ends when its loss scale has
  // collapsed). Synchronises.
  void check_steps(int64_t step);
  // The loss scale and skipped steps of fp16 runs, in each log record.
  StepReport::FieldSource loss_scale_fields() const;

  // debug.fail_*: the fault a test asked for at the start of `step`, or during its save.
  void inject_fault(int64_t step) const;
  void inject_fault_in_save(int64_t step) const;
  // Whether any rank was asked to stop (SIGTERM, SIGUSR1, SIGINT): every rank learns it at this
  // step boundary.
  bool stop_requested_anywhere() const;

 private:
  bool fault_due(int64_t step, FailMode mode) const;

  const TrainConfig& config_;
  ParallelContext& parallel_;
  torch::Device device_;
  std::unique_ptr<DynamicLossScaler> loss_scaler_;  // fp16 only
  torch::Tensor nonfinite_steps_;  // since the last check
  int64_t last_checked_step_ = 0;
};

}  // namespace dstrain
