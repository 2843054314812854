#include "dstrain/pipeline/executor.h"

#include "dstrain/core/error.h"
#include "dstrain/model/moe.h"

namespace dstrain {

PipelineExecutor::PipelineExecutor(Schedule train, Schedule eval, int stage, std::vector<CausalLM> chunks,
                                   Communicator& pp_group, const ActivationShape& shape)
    : train_(std::move(train)), eval_(std::move(eval)), stage_(stage), chunks_(std::move(chunks)),
      pp_group_(pp_group), shape_(shape),
      activation_width_(CausalLMImpl::stage_activation_width(chunks_.front()->config(),
                                                              train_.pp * train_.virtual_stages)) {}

bool PipelineExecutor::has_loss() const {
  return train_.virtual_stage(stage_, train_.virtual_stages - 1) == train_.last_virtual_stage();
}

bool PipelineExecutor::needs_batches() const { return stage_ == 0 || has_loss(); }

torch::Tensor PipelineExecutor::train_step(const BatchSource& batch, double loss_divisor,
                                           const torch::Tensor& loss_scale) {
  return run(train_, batch, loss_divisor, loss_scale);
}

torch::Tensor PipelineExecutor::evaluate(const BatchSource& batch) {
  torch::NoGradGuard no_grad;
  return run(eval_, batch, 1.0, torch::Tensor());
}

torch::Tensor PipelineExecutor::run(const Schedule& schedule, const BatchSource& batch, double loss_divisor,
                                    const torch::Tensor& loss_scale) {
  const bool training = schedule.kind != ScheduleKind::kForwardOnly;
  const torch::Device device = shape_.device;
  // Training or evaluation mode (MoE layers count expert loads and add their balance loss in
  // training only).
  for (CausalLM& chunk : chunks_) chunk->train(training);
  if (training) {
    // Auxiliary losses (MoE balance) get the gradient the main loss gets.
    torch::Tensor factor = torch::full({}, 1.0 / loss_divisor, torch::dtype(torch::kFloat32).device(device));
    set_auxiliary_loss_gradient_scale(loss_scale.defined() ? factor * loss_scale : factor);
  }
  const int64_t seq = shape_.seq_len;
  // The pipeline's bubble, which the log reports for training steps with pp > 1; without that
  // the events would pile up unread.
  const bool timed = training && pp_group_.size() > 1;
  const accel::Timestamp step_start = timed ? accel::Timestamp::now(device) : accel::Timestamp();
  torch::Tensor loss_sum = torch::zeros({}, torch::dtype(training ? torch::kFloat32 : torch::kFloat64).device(device));
  const double mtp_weight = chunks_.front()->config().mtp_loss_weight;
  mtp_loss_ = training && has_loss() && chunks_.front()->config().num_nextn_predict_layers > 0
                  ? torch::zeros({}, torch::dtype(torch::kFloat32).device(device))
                  : torch::Tensor();
  std::map<int, torch::Tensor> batches;  // fetched once per micro-batch
  auto tokens = [&](int microbatch) -> const torch::Tensor& {
    auto it = batches.find(microbatch);
    if (it == batches.end()) it = batches.emplace(microbatch, batch(microbatch)).first;
    return it->second;
  };
  auto activation_buffer = [&] {
    return torch::empty({shape_.micro_batch, seq, activation_width_}, torch::dtype(shape_.dtype).device(device));
  };

  const std::vector<Action>& actions = schedule.stages[stage_];
  std::vector<Transfer> group;
  std::vector<std::pair<Key, bool>> group_receives;  // (key, is activation) of the group's receives
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const Key key{a.microbatch, a.chunk};
    const int vs = schedule.virtual_stage(stage_, a.chunk);
    if (!a.is_compute()) {
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
          t.tensor = activation_buffer();
          group_receives.emplace_back(key, a.kind == ActionKind::kRecvActivation);
          break;
        default:
          break;
      }
      group.push_back(std::move(t));
      const bool group_ends = i + 1 == actions.size() || actions[i + 1].is_compute();
      if (group_ends) {
        const accel::Timestamp wait_start = timed ? accel::Timestamp::now(device) : accel::Timestamp();
        pp_group_.exchange(group);
        if (timed) waits_.emplace_back(wait_start, accel::Timestamp::now(device));
        for (size_t r = 0, g = 0; g < group.size(); ++g) {
          if (group[g].send) continue;
          const auto& [receive_key, activation] = group_receives[r++];
          if (activation)
            inputs_[receive_key] = group[g].tensor.requires_grad_(training);
          else
            received_grads_[receive_key] = group[g].tensor;
        }
        group.clear();
        group_receives.clear();
      }
      continue;
    }

    if (a.kind == ActionKind::kForward) {
      torch::Tensor input = vs == 0 ? tokens(a.microbatch).narrow(1, 0, seq) : inputs_.at(key);
      if (!training) inputs_.erase(key);  // no backward will need it
      if (vs == schedule.last_virtual_stage()) {
        // Multi-token prediction trains; evaluation measures the next token only.
        const LanguageModelLosses losses = chunks_[a.chunk]->losses(input, tokens(a.microbatch), training);
        if (training) {
          torch::Tensor loss = losses.total(mtp_weight) / loss_divisor;
          loss_sum += losses.next_token.detach() / loss_divisor;
          if (losses.mtp.defined()) mtp_loss_ += losses.mtp.detach() / loss_divisor;
          outputs_[key] = loss_scale.defined() ? loss * loss_scale : loss;
        } else {
          loss_sum += losses.next_token.to(torch::kFloat64);
        }
      } else {
        outputs_[key] = chunks_[a.chunk]->forward(input);
      }
      continue;
    }

    // Backward: from the loss, or from the gradient the next virtual stage sent back.
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
  if (!inputs_.empty() || !outputs_.empty() || !received_grads_.empty())
    throw Error(ExitCode::kInternal, "pipeline: the schedule left activations behind on stage " + std::to_string(stage_));
  if (timed) steps_.emplace_back(step_start, accel::Timestamp::now(device));
  return loss_sum;
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
