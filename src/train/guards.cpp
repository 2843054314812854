#include "dstrain/train/guards.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <thread>

#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/core/text.h"
#include "dstrain/train/signals.h"

namespace dstrain {

StepGuards::StepGuards(const TrainConfig& config, ParallelContext& parallel, const torch::Device& device)
    : config_(config), parallel_(parallel), device_(device) {
  if (config.loop.precision == torch::kFloat16)
    loss_scaler_ = std::make_unique<DynamicLossScaler>(config.optim.loss_scale,
                                                       config.optim.loss_scale_growth_interval, device);
  nonfinite_steps_ = torch::zeros({}, torch::dtype(torch::kFloat32).device(device));
}

torch::Tensor StepGuards::backward_scale(int64_t step) const {
  if (fault_due(step, FailMode::kNan))  // the gradients of this rank's backward passes become NaN
    return torch::full({}, std::numeric_limits<float>::quiet_NaN(), torch::dtype(torch::kFloat32).device(device_));
  return loss_scaler_ ? loss_scaler_->scale() : torch::Tensor();
}

torch::Tensor StepGuards::record_step(const torch::Tensor& grad_norm) {
  // A step whose gradient norm is not finite changes nothing (the optimizer skips it on the
  // device); the next check reports it, and stops the run unless fp16 overflow explains it.
  torch::Tensor found_inf = grad_norm.isfinite().logical_not().to(torch::kFloat32);
  nonfinite_steps_ += found_inf;
  return found_inf;
}

void StepGuards::check_logged_loss(int64_t step, double loss) {
  // A non-finite loss goes with a non-finite gradient norm: what check_steps decides.
  if (!std::isfinite(loss) && !config_.optim.skip_nonfinite && !loss_scaler_)
    throw Error(ExitCode::kNumerical, "step " + std::to_string(step) + ": the loss is not finite (" +
                                          std::to_string(loss) + "); lower optim.lr or check the data");
  check_steps(step);
}

void StepGuards::check_steps(int64_t step) {
  // A collective that hangs on a GPU surfaces here (after comm.timeout_s), not in the read below.
  parallel_.group(Group::kPp).synchronize();
  parallel_.group(Group::kDpCp).synchronize();
  const int64_t nonfinite = static_cast<int64_t>(nonfinite_steps_.item<float>());
  const std::string steps_text = step_range_text(last_checked_step_ + 1, step);
  if (!loss_scaler_ && nonfinite > 0 && config_.optim.skip_nonfinite) {
    log::warning(steps_text, ": ", nonfinite, " step(s) with a non-finite gradient norm skipped (optim.nonfinite = skip)");
    nonfinite_steps_.zero_();
  }
  if (!loss_scaler_ && nonfinite > 0 && !config_.optim.skip_nonfinite)
    throw Error(ExitCode::kNumerical, steps_text + ": the gradient norm was not finite in " +
                                          std::to_string(nonfinite) +
                                          " step(s), which changed nothing; lower optim.lr or check the data (the "
                                          "last checkpoint is intact; optim.nonfinite = skip goes on instead)");
  if (loss_scaler_) {
    const double loss_scale = loss_scaler_->scale().item<double>();
    if (loss_scale < 1.0)
      throw Error(ExitCode::kNumerical, steps_text + ": the fp16 loss scale fell to " + std::to_string(loss_scale) +
                                            ": gradients overflow even unscaled; use train.precision = bf16 "
                                            "or lower optim.lr");
  }
  last_checked_step_ = step;
}

StepReport::FieldSource StepGuards::loss_scale_fields() const {
  return [this](nlohmann::json& record) {
    if (!loss_scaler_) return;
    record["loss_scale"] = loss_scaler_->scale().item<double>();
    record["skipped_steps"] = static_cast<int64_t>(loss_scaler_->skipped_steps().item<float>());
  };
}

bool StepGuards::fault_due(int64_t step, FailMode mode) const {
  return config_.debug.fail_at_step == step && config_.debug.fail_mode == mode &&
         parallel_.world_rank() == config_.debug.fail_rank;
}

void StepGuards::inject_fault(int64_t step) const {
  if (fault_due(step, FailMode::kKill)) std::raise(SIGKILL);
  if (fault_due(step, FailMode::kSigterm)) std::raise(SIGTERM);
  if (fault_due(step, FailMode::kSigint)) std::raise(SIGINT);
  if (fault_due(step, FailMode::kHang)) {
    log::error("debug.fail_mode = hang: rank ", parallel_.world_rank(), " stops answering at step ", step);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
  }
}

void StepGuards::inject_fault_in_save(int64_t step) const {
  if (fault_due(step, FailMode::kKillInSave)) std::raise(SIGKILL);
}

bool StepGuards::stop_requested_anywhere() const {
  torch::Tensor stop = torch::full({1}, signals::stop_requested() ? 1 : 0, torch::kInt32);
  parallel_.world().all_reduce(stop, ReduceOp::kMax);
  return stop.item<int>() != 0;
}

}  // namespace dstrain
