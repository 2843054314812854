#include "dstrain/pipeline/executor.h"

#include <algorithm>
#include <array>
#include <optional>

#include "dstrain/core/error.h"
#include "dstrain/parallel/side_lane.h"

namespace dstrain {

PipelineExecutor::PipelineExecutor(Schedule train, Schedule eval, int stage, PipelineStage& model,
                                   WeightGradientStore& weight_gradients, Communicator& pp_group,
                                   const ActivationShape& shape)
    : train_(std::move(train)),
      eval_(std::move(eval)),
      stage_(stage),
      model_(model),
      pp_group_(pp_group),
      shape_(shape),
      activation_width_(model.activation_width()),
      weight_gradients_(weight_gradients) {
  if (train_.sends_without_waiting()) channels_ = std::make_unique<PipelineChannels>(train_, pp_group_, shape_.device);
}

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
  // Zero-bubble schedules: every projection built in this step leaves its weight gradient to W.
  std::optional<WeightGradientStore::Deferral> deferral;
  if (training && schedule.splits_backward()) deferral.emplace(weight_gradients_);
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

  auto tokens_for = [&](const Action& f) {  // what a forward on the first or last virtual stage needs
    const int vs = schedule.virtual_stage(stage_, f.chunk);
    return vs == 0 || vs == schedule.last_virtual_stage() ? tokens(f.microbatch) : torch::Tensor();
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
      continue;
    }
    if (a.paired && pairs_side_by_side_ && training) {
      const std::vector<Action> backward_actions = paired_backward(actions, i);
      run_pair(schedule, a, tokens_for(a), backward_actions, loss_divisor, loss_scale, sums, timed);
      i += backward_actions.size();
      continue;
    }
    timed_compute(a, timed, [&] {
      if (a.kind == ActionKind::kForward)
        forward(schedule, a, tokens_for(a), training, loss_divisor, loss_scale, sums);
      else
        backward_or_weights(schedule, a);
    });
  }
  const accel::Timestamp sends_start = timed ? accel::Timestamp::now(device) : accel::Timestamp();
  for (auto& send : sends_) send->wait();
  sends_.clear();
  if (timed) waits_.emplace_back(sends_start, accel::Timestamp::now(device));
  if (!inputs_.empty() || !outputs_.empty() || !received_grads_.empty() || !weight_gradients_.empty())
    throw Error(ExitCode::kInternal, "pipeline: the schedule left activations behind on stage " + std::to_string(stage_));
  if (timed) steps_.emplace_back(step_start, accel::Timestamp::now(device));
  return sums;
}

void PipelineExecutor::forward(const Schedule& schedule, const Action& a, const torch::Tensor& tokens, bool training,
                               double loss_divisor, const torch::Tensor& loss_scale, std::vector<torch::Tensor>& sums) {
  const torch::Tensor input = forward_input(schedule, a, tokens, training);
  keep_forward(schedule, a, compute_forward(schedule, a, input, tokens), training, loss_divisor, loss_scale, sums);
}

torch::Tensor PipelineExecutor::forward_input(const Schedule& schedule, const Action& a, const torch::Tensor& tokens,
                                              bool training) {
  const Key key{a.microbatch, a.chunk};
  if (schedule.virtual_stage(stage_, a.chunk) == 0) return tokens.narrow(1, 0, shape_.seq_len);
  torch::Tensor input = inputs_.at(key);
  if (!training) inputs_.erase(key);  // no backward will need it
  return input;
}

PipelineExecutor::ForwardResult PipelineExecutor::compute_forward(const Schedule& schedule, const Action& a,
                                                                  const torch::Tensor& input,
                                                                  const torch::Tensor& tokens) {
  ForwardResult result;
  if (schedule.virtual_stage(stage_, a.chunk) != schedule.last_virtual_stage())
    result.output = model_.forward(a.chunk, input);
  else
    result.losses = model_.losses(a.chunk, input, tokens);
  return result;
}

void PipelineExecutor::keep_forward(const Schedule& schedule, const Action& a, const ForwardResult& result,
                                    bool training, double loss_divisor, const torch::Tensor& loss_scale,
                                    std::vector<torch::Tensor>& sums) {
  const Key key{a.microbatch, a.chunk};
  const int vs = schedule.virtual_stage(stage_, a.chunk);
  if (vs != schedule.last_virtual_stage()) {
    torch::Tensor& output = outputs_[key] = result.output;
    if (schedule.stage_of(vs + 1) == stage_) {  // the next virtual stage is here (a V's turn): no transfer
      inputs_[{a.microbatch, schedule.chunk_of(vs + 1)}] = output.detach().requires_grad_(training);
      if (!training) outputs_.erase(key);
    }
    return;
  }
  const MicroBatchLosses& losses = result.losses;
  if (!training) {
    sums[0] += losses.reported.at(0).to(torch::kFloat64);
    return;
  }
  torch::Tensor objective = losses.objective / loss_divisor;
  for (size_t i = 0; i < sums.size(); ++i)
    if (losses.reported.at(i).defined()) sums[i] += losses.reported[i].detach() / loss_divisor;
  outputs_[key] = loss_scale.defined() ? objective * loss_scale : objective;
}

std::vector<Action> PipelineExecutor::paired_backward(const std::vector<Action>& actions, size_t forward) {
  // The backward pass right after the forward, and its weight gradients if they come at once;
  // what follows is another segment's, which may need the forward's result.
  std::vector<Action> pair;
  if (forward + 1 < actions.size() && actions[forward + 1].kind == ActionKind::kBackward) {
    const Action& b = actions[forward + 1];
    pair.push_back(b);
    if (forward + 2 < actions.size() && actions[forward + 2].kind == ActionKind::kWeight &&
        actions[forward + 2].microbatch == b.microbatch && actions[forward + 2].chunk == b.chunk)
      pair.push_back(actions[forward + 2]);
  }
  if (pair.empty()) throw Error(ExitCode::kInternal, "pipeline: a paired forward without a backward pass after it");
  return pair;
}

void PipelineExecutor::run_pair(const Schedule& schedule, const Action& f, const torch::Tensor& tokens,
                                const std::vector<Action>& backward_actions, double loss_divisor,
                                const torch::Tensor& loss_scale, std::vector<torch::Tensor>& sums, bool timed) {
  const torch::Device device = shape_.device;
  // The side lane touches none of the executor's state: it is handed its input and hands back its result.
  const torch::Tensor input = forward_input(schedule, f, tokens, /*training=*/true);
  ForwardResult result;
  accel::Timestamp start, end;
  SideLane side([&] {
    start = accel::Timestamp::now(device);
    result = compute_forward(schedule, f, input, tokens);
    end = accel::Timestamp::now(device);
  });
  const LaneTimeline main = timed_lane([&] {
    for (const Action& b : backward_actions) timed_compute(b, timed, [&] { backward_or_weights(schedule, b); });
  });
  const LaneTimeline& forward_lane = side.join();
  // (The forward's span overlaps the backward's: the simulator's prediction, which takes them one
  // after the other, is then an upper bound.)
  if (timed) computes_.push_back({ActionKind::kForward, f.chunk, start, end});
  hidden_exchange_seconds_ += hidden_wait_seconds(forward_lane, main);
  keep_forward(schedule, f, result, /*training=*/true, loss_divisor, loss_scale, sums);
}

void PipelineExecutor::timed_compute(const Action& a, bool timed, const std::function<void()>& work) {
  const accel::Timestamp start = timed ? accel::Timestamp::now(shape_.device) : accel::Timestamp();
  work();
  if (timed) computes_.push_back({a.kind, a.chunk, start, accel::Timestamp::now(shape_.device)});
}

void PipelineExecutor::backward_or_weights(const Schedule& schedule, const Action& a) {
  if (a.kind == ActionKind::kBackward)
    backward(schedule, a);
  else
    weight_gradients_.compute({a.microbatch, a.chunk});
}

void PipelineExecutor::backward(const Schedule& schedule, const Action& a) {
  // From the objective, or from the gradient the next virtual stage sent back.
  const Key key{a.microbatch, a.chunk};
  const int vs = schedule.virtual_stage(stage_, a.chunk);
  torch::Tensor output = outputs_.at(key);
  outputs_.erase(key);
  torch::Tensor grad;  // none on the last virtual stage: the objective's own
  if (vs != schedule.last_virtual_stage()) {
    grad = received_grads_.at(key);
    received_grads_.erase(key);
  }
  auto backward = [&] { grad.defined() ? output.backward(grad) : output.backward(); };
  // A split backward pass (B) leaves the projections' weight gradients for the W action.
  if (schedule.splits_backward())
    weight_gradients_.collect({a.microbatch, a.chunk}, backward);
  else
    backward();
  if (vs == 0) {
    inputs_.erase(key);  // token ids: nothing to send back
  } else if (schedule.stage_of(vs - 1) == stage_) {  // the previous virtual stage is here: no transfer
    received_grads_[{a.microbatch, schedule.chunk_of(vs - 1)}] = inputs_.at(key).grad();
    inputs_.erase(key);
  }
}

void PipelineExecutor::exchange(const Schedule& schedule, const std::vector<Action>& transfers, bool training,
                                bool timed) {
  const torch::Device device = shape_.device;
  // A schedule whose sends do not wait goes on the channels; the others (evaluation's too) on the
  // PP group, in groups that complete together.
  PipelineChannels* channels = schedule.sends_without_waiting() ? channels_.get() : nullptr;
  std::vector<Transfer> group;
  std::vector<TransferId> ids;  // of the group's transfers
  std::vector<std::pair<Key, bool>> receives;  // (key, is activation) of the group's receives
  for (const Action& a : transfers) {
    const Key key{a.microbatch, a.chunk};
    const TransferId id = transfer_id(schedule, stage_, a);
    Transfer t{false, torch::Tensor(), a.peer, transfer_tag(schedule, id)};
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
        t.tensor = torch::empty({shape_.micro_batch, activation_positions(), activation_width_},
                                torch::dtype(shape_.dtype).device(device));
        receives.emplace_back(key, a.kind == ActionKind::kRecvActivation);
        break;
      default:
        break;
    }
    if (t.send && channels) {
      sends_.push_back(channels->send_async(id, t));  // kept until it completes
      continue;
    }
    group.push_back(std::move(t));
    ids.push_back(id);
  }
  // Sends that have completed give their tensors back (an activation, an input's gradient) now
  // rather than at the step's end.
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(), [](const auto& send) { return send->ready(); }),
               sends_.end());
  const accel::Timestamp wait_start = timed ? accel::Timestamp::now(device) : accel::Timestamp();
  if (channels)
    channels->exchange(group, ids);
  else if (!group.empty())
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

double PipelineExecutor::take_hidden_exchange_seconds() {
  const double seconds = hidden_exchange_seconds_;
  hidden_exchange_seconds_ = 0;
  return seconds;
}

std::vector<ActionCosts> PipelineExecutor::take_action_costs() {
  if (computes_.empty()) return {};
  std::vector<ActionCosts> sums(static_cast<size_t>(train_.virtual_stages));
  std::vector<std::array<int, 3>> counts(sums.size(), {0, 0, 0});
  for (const ComputeSpan& span : computes_) {
    const double seconds = span.end.seconds_since(span.start);
    ActionCosts& sum = sums[static_cast<size_t>(span.chunk)];
    std::array<int, 3>& count = counts[static_cast<size_t>(span.chunk)];
    if (span.kind == ActionKind::kForward) sum.forward += seconds, ++count[0];
    if (span.kind == ActionKind::kBackward) sum.backward += seconds, ++count[1];
    if (span.kind == ActionKind::kWeight) sum.weight += seconds, ++count[2];
  }
  computes_.clear();
  for (size_t c = 0; c < sums.size(); ++c) {
    sums[c].forward /= std::max(1, counts[c][0]);
    sums[c].backward /= std::max(1, counts[c][1]);
    sums[c].weight /= std::max(1, counts[c][2]);
  }
  return sums;
}

}  // namespace dstrain
