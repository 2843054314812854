#include "dstrain/pipeline/executor.h"

#include "dstrain/core/error.h"

namespace dstrain {

PipelineExecutor::PipelineExecutor(Schedule train, Schedule eval, int stage, PipelineStage& model,
                                   Communicator& pp_group, const ActivationShape& shape)
    : train_(std::move(train)), eval_(std::move(eval)), stage_(stage), model_(model), pp_group_(pp_group),
      shape_(shape), activation_width_(model.activation_width()) {}

void PipelineExecutor::set_microbatches(int microbatches) {
  if (microbatches != train_.microbatches)
    train_ = make_schedule(train_.kind, train_.pp, train_.virtual_stages, microbatches);
}

bool PipelineExecutor::has_loss() const {
  return train_.virtual_stage(stage_, train_.virtual_stages - 1) == train_.last_virtual_stage();
}

bool PipelineExecutor::needs_batches() const { return stage_ == 0 || has_loss(); }

std::vector<torch::Tensor> PipelineExecutor::train_step(const BatchSource& batch, double loss_divisor,
                                                        const torch::Tensor& loss_scale) {
  return run(train_, batch, loss_divisor, loss_scale);
}

torch::Tensor PipelineExecutor::evaluate(const BatchSource& batch) {
  torch::NoGradGuard no_grad;
  return run(eval_, batch, 1.0, torch::Tensor()).front();
}

std::vector<torch::Tensor> PipelineExecutor::run(const Schedule& schedule, const BatchSource& batch,
                                                 double loss_divisor, const torch::Tensor& loss_scale) {
  const bool training = schedule.kind != ScheduleKind::kForwardOnly;
  const torch::Device device = shape_.device;
  // Losses added inside the chunks (MoE balance) get the gradient the objective gets.
  torch::Tensor factor;
  if (training) {
    factor = torch::full({}, 1.0 / loss_divisor, torch::dtype(torch::kFloat32).device(device));
    if (loss_scale.defined()) factor = factor * loss_scale;
  }
  model_.begin_pass(training, factor);
  // The pipeline's bubble, which the log reports for training steps with pp > 1; without that
  // the events would pile up unread.
  const bool timed = training && pp_group_.size() > 1;
  const accel::Timestamp step_start = timed ? accel::Timestamp::now(device) : accel::Timestamp();
  const size_t losses = training ? model_.loss_names().size() : 1;
  std::vector<torch::Tensor> sums;
  for (size_t i = 0; i < losses; ++i)
    sums.push_back(torch::zeros({}, torch::dtype(training ? torch::kFloat32 : torch::kFloat64).device(device)));
  std::map<int, torch::Tensor> batches;  // fetched once per micro-batch
  auto tokens = [&](int microbatch) -> const torch::Tensor& {
    auto it = batches.find(microbatch);
    if (it == batches.end()) it = batches.emplace(microbatch, batch(microbatch)).first;
    return it->second;
  };

  const std::vector<Action>& actions = schedule.stages[stage_];
  std::vector<Action> transfers;  // consecutive transfer actions go as one group
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (!a.is_compute()) {
      transfers.push_back(a);
      if (i + 1 == actions.size() || actions[i + 1].is_compute()) {
        exchange(schedule, transfers, training, timed);
        transfers.clear();
      }
    } else if (a.kind == ActionKind::kForward) {
      const bool first = schedule.virtual_stage(stage_, a.chunk) == 0;
      const bool last = schedule.virtual_stage(stage_, a.chunk) == schedule.last_virtual_stage();
      forward(schedule, a, first || last ? tokens(a.microbatch) : torch::Tensor(), training, loss_divisor,
              loss_scale, sums);
    } else {
      backward(schedule, a);
    }
  }
  if (!inputs_.empty() || !outputs_.empty() || !received_grads_.empty())
    throw Error(ExitCode::kInternal, "pipeline: the schedule left activations behind on stage " + std::to_string(stage_));
  if (timed) steps_.emplace_back(step_start, accel::Timestamp::now(device));
  return sums;
}

void PipelineExecutor::forward(const Schedule& schedule, const Action& a, const torch::Tensor& tokens, bool training,
                               double loss_divisor, const torch::Tensor& loss_scale, std::vector<torch::Tensor>& sums) {
  const Key key{a.microbatch, a.chunk};
  const int vs = schedule.virtual_stage(stage_, a.chunk);
  torch::Tensor input = vs == 0 ? tokens.narrow(1, 0, shape_.seq_len) : inputs_.at(key);
  if (!training) inputs_.erase(key);  // no backward will need it
  if (vs != schedule.last_virtual_stage()) {
    outputs_[key] = model_.forward(a.chunk, input);
    return;
  }
  const MicroBatchLosses losses = model_.losses(a.chunk, input, tokens);
  if (!training) {
    sums[0] += losses.reported.at(0).to(torch::kFloat64);
    return;
  }
  torch::Tensor objective = losses.objective / loss_divisor;
  for (size_t i = 0; i < sums.size(); ++i)
    if (losses.reported.at(i).defined()) sums[i] += losses.reported[i].detach() / loss_divisor;
  outputs_[key] = loss_scale.defined() ? objective * loss_scale : objective;
}

void PipelineExecutor::backward(const Schedule& schedule, const Action& a) {
  // From the objective, or from the gradient the next virtual stage sent back.
  const Key key{a.microbatch, a.chunk};
  const int vs = schedule.virtual_stage(stage_, a.chunk);
  torch::Tensor output = outputs_.at(key);
  outputs_.erase(key);
  if (vs == schedule.last_virtual_stage()) {
    output.backward();
  } else {
    torch::Tensor grad = received_grads_.at(key);
    received_grads_.erase(key);
    output.backward(grad);
  }
  if (vs == 0) inputs_.erase(key);  // token ids: nothing to send back
}

void PipelineExecutor::exchange(const Schedule& schedule, const std::vector<Action>& transfers, bool training,
                                bool timed) {
  const torch::Device device = shape_.device;
  std::vector<Transfer> group;
  std::vector<std::pair<Key, bool>> receives;  // (key, is activation) of the group's receives
  for (const Action& a : transfers) {
    const Key key{a.microbatch, a.chunk};
    Transfer t{false, torch::Tensor(), a.peer, transfer_tag(schedule, transfer_id(schedule, stage_, a))};
    switch (a.kind) {
      case ActionKind::kSendActivation:
        t.send = true;
        t.tensor = outputs_.at(key).detach().contiguous();
        if (!training) outputs_.erase(key);  // nothing comes back in evaluation
        break;
      case ActionKind::kSendGrad:
        t.send = true;
        t.tensor = inputs_.at(key).grad().contiguous();
        inputs_.erase(key);
        break;
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGrad:
        t.tensor = torch::empty({shape_.micro_batch, shape_.seq_len, activation_width_},
                                torch::dtype(shape_.dtype).device(device));
        receives.emplace_back(key, a.kind == ActionKind::kRecvActivation);
        break;
      default:
        break;
    }
    group.push_back(std::move(t));
  }
  const accel::Timestamp wait_start = timed ? accel::Timestamp::now(device) : accel::Timestamp();
  pp_group_.exchange(group);
  if (timed) waits_.emplace_back(wait_start, accel::Timestamp::now(device));
  for (size_t r = 0, g = 0; g < group.size(); ++g) {
    if (group[g].send) continue;
    const auto& [key, activation] = receives[r++];
    if (activation)
      inputs_[key] = group[g].tensor.requires_grad_(training);
    else
      received_grads_[key] = group[g].tensor;
  }
}

std::pair<double, double> PipelineExecutor::take_wait_and_span() {
  double wait = 0, span = 0;
  for (const auto& [start, end] : waits_) wait += end.seconds_since(start);
  for (const auto& [start, end] : steps_) span += end.seconds_since(start);
  waits_.clear();
  steps_.clear();
  return {wait, span};
}

}  // namespace dstrain
