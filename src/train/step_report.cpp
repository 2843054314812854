#include "dstrain/train/step_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/log.h"
#include "dstrain/pipeline/bubble.h"
#include "dstrain/train/metrics.h"

namespace dstrain {
namespace {

double seconds_since(StepReport::Clock::time_point start) {
  return std::chrono::duration<double>(StepReport::Clock::now() - start).count();
}

// The log line's part for each optional field of a training record, in the line's order.
std::string optional_fields_text(const nlohmann::json& r) {
  std::string text;
  char part[64];
  auto add = [&](const char* key, const char* format, double scale = 1) {
    if (!r.contains(key)) return;
    std::snprintf(part, sizeof part, format, scale * r[key].get<double>());
    text += part;
  };
  add("global_batch", " | batch %.0f");
  add("mtp_loss", " | MTP loss %.4f");
  add("balance_loss", " | balance loss %.3g");
  add("mfu", " | MFU %.1f%%", 100);
  add("memory_gib", " | %.1f GiB");
  add("pipeline_idle", " | bubble %.0f%%", 100);
  add("pipeline_idle_predicted", " (predicted %.0f%%)", 100);
  auto add_worst_layer = [&](const char* key, const char* format) {
    if (!r.contains(key)) return;
    double worst = 0;
    for (const auto& [layer, value] : r[key].items()) worst = std::max(worst, value.get<double>());
    std::snprintf(part, sizeof part, format, worst);
    text += part;
  };
  add_worst_layer("expert_load_max_over_mean", " | expert load max/mean %.2f");
  add_worst_layer("ep_load_max_over_mean", " | EP rank load max/mean %.2f");
  add("expert_exchange_share", " | expert exchange %.0f%%", 100);
  add("expert_exchange_hidden", " (%.0f%% hidden)", 100);
  if (r.contains("dp_comm_s")) {
    std::snprintf(part, sizeof part, " | DP comm %.0f ms, %.0f ms exposed", 1000 * r["dp_comm_s"].get<double>(),
                  1000 * r["dp_comm_exposed_s"].get<double>());
    text += part;
  }
  if (r.contains("dp_comm_bytes")) {
    std::snprintf(part, sizeof part, "%s%.2f MB sent", r.contains("dp_comm_s") ? ", " : " | DP comm ",
                  r["dp_comm_bytes"].get<double>() / 1e6);
    text += part;
  }
  if (r.contains("loss_scale")) {
    std::snprintf(part, sizeof part, " | scale %.0f, %lld skipped", r["loss_scale"].get<double>(),
                  static_cast<long long>(r["skipped_steps"].get<int64_t>()));
    text += part;
  }
  return text;
}

}  // namespace

ConsoleSink::ConsoleSink(int64_t start_step, int64_t total_steps)
    : start_step_(start_step), total_steps_(total_steps), last_step_(start_step) {}

void ConsoleSink::write(const nlohmann::json& r) {
  const int64_t step = r["step"].get<int64_t>();
  if (r.contains("eval_loss")) {
    log::info("eval at step ", step, " | loss ", r["eval_loss"].get<double>(), " | perplexity ",
              r["eval_ppl"].get<double>());
    return;
  }
  const double step_seconds = r["step_time_s"].get<double>();
  trained_seconds_ += step_seconds * static_cast<double>(step - last_step_);
  last_step_ = step;
  const double mean_step_seconds = trained_seconds_ / static_cast<double>(step - start_step_);
  char line[320];
  std::snprintf(line, sizeof line,
                "step %*lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | %.3f s/step%s | ETA %s",
                static_cast<int>(std::to_string(total_steps_).size()), static_cast<long long>(step),
                static_cast<long long>(total_steps_), r["loss"].get<double>(), r["lr"].get<double>(),
                r["grad_norm"].get<double>(), with_commas(r["tokens_per_s"].get<double>()).c_str(), step_seconds,
                optional_fields_text(r).c_str(),
                format_duration(mean_step_seconds * static_cast<double>(total_steps_ - step)).c_str());
  log::info(line);
}

StepReport::StepReport(const StepReportSettings& settings, ParallelContext& parallel)
    : settings_(settings), parallel_(parallel), consumed_(settings.start_consumed) {}

void StepReport::add(const StepResult& step) {
  const torch::Tensor taken = step.grad_norm.isfinite();
  auto accumulate = [](torch::Tensor& sum, const torch::Tensor& value) { sum = sum.defined() ? sum + value : value; };
  ++interval_.steps;
  interval_.samples += step.samples;
  consumed_ += step.samples;
  last_.samples = step.samples;
  last_.lr = step.lr;
  interval_.sums.resize(step.values.size());
  for (size_t i = 0; i < step.values.size(); ++i) {
    const torch::Tensor value = step.values[i].second.to(torch::kFloat64);
    accumulate(interval_.sums[i], torch::where(taken, value, torch::zeros_like(value)));
  }
  accumulate(interval_.taken_steps, taken.to(torch::kFloat64));
}

double StepReport::measure(int64_t step, const StepResult& last) {
  // The mean over the steps taken; the last step's value when every step was skipped. The
  // values are on the stages that compute them: the sum over the stages brings them to every one.
  std::vector<torch::Tensor> means;
  const torch::Tensor& taken = interval_.taken_steps;
  for (size_t i = 0; i < last.values.size(); ++i)
    means.push_back(torch::where(taken > 0, interval_.sums[i] / taken.clamp_min(1),
                                 last.values[i].second.to(torch::kFloat64)));
  torch::Tensor values = torch::stack(means);
  parallel_.pp_group->all_reduce(values, ReduceOp::kSum);
  parallel_.dp_group->all_reduce(values, ReduceOp::kAvg);
  parallel_.pp_group->synchronize();
  parallel_.dp_group->synchronize();
  const double grad_norm = last.grad_norm.item<double>();
  const double seconds = seconds_since(interval_.start) - interval_.excluded_seconds;
  const double tokens = static_cast<double>(interval_.samples * settings_.seq_len);
  const double tokens_per_s = tokens / seconds;
  const auto consumed = static_cast<uint64_t>(consumed_);
  measured_ = {{"step", step},
               {"lr", last_.lr},
               {"grad_norm", grad_norm},
               {"tokens_per_s", tokens_per_s},
               {"step_time_s", seconds / static_cast<double>(interval_.steps)},
               {"consumed_samples", consumed},
               {"tokens", consumed * static_cast<uint64_t>(settings_.seq_len)}};
  if (settings_.reports_global_batch) measured_["global_batch"] = last_.samples;
  for (size_t i = 0; i < last.values.size(); ++i)
    measured_[last.values[i].first] = values[static_cast<int64_t>(i)].item<double>();
  if (settings_.peak_flops > 0) measured_["mfu"] = settings_.flops_per_token * tokens_per_s / settings_.peak_flops;
  if (settings_.device.is_cuda())
    measured_["memory_gib"] = static_cast<double>(accel::peak_allocated_bytes(settings_.device)) / (1 << 30);
  Throughput& throughput = logged_intervals_++ == 0 ? first_ : later_;
  throughput.seconds += seconds;
  throughput.tokens += tokens;
  final_loss_ = measured_["loss"].get<double>();
  return final_loss_;
}

void StepReport::write() {
  for (const FieldSource& source : sources_) source(measured_);
  for (const auto& sink : sinks_) sink->write(measured_);
}

void StepReport::untimed(int64_t step, const std::function<void()>& work) {
  if (due(step)) return work();  // the interval restarts after this step anyway
  // The device first finishes the steps queued before the work.
  accel::synchronize(settings_.device);
  const Clock::time_point start = Clock::now();
  work();
  interval_.excluded_seconds += seconds_since(start);
}

void StepReport::finish_step(int64_t step) {
  if (due(step)) interval_ = Interval{};
}

void StepReport::write_evaluation(int64_t step, double loss) {
  const nlohmann::json record = {{"step", step}, {"eval_loss", loss}, {"eval_ppl", std::exp(loss)}};
  for (const auto& sink : sinks_) sink->write(record);
}

namespace {

// What one forward, backward and weight-gradient action of each virtual stage took in the
// interval, averaged over the data-parallel replicas: every rank fills its own stage's places.
std::vector<ActionCosts> measured_action_costs(PipelineExecutor& executor, ParallelContext& parallel) {
  const Schedule& schedule = executor.training_schedule();
  const int virtual_stages = schedule.pp * schedule.virtual_stages;
  torch::Tensor costs = torch::zeros({virtual_stages, 3}, torch::kFloat64);
  const std::vector<ActionCosts> mine = executor.take_action_costs();
  for (size_t chunk = 0; chunk < mine.size(); ++chunk) {
    const int vs = schedule.virtual_stage(parallel.coord.pp, static_cast<int>(chunk));
    costs[vs][0] = mine[chunk].forward;
    costs[vs][1] = mine[chunk].backward;
    costs[vs][2] = mine[chunk].weight;
  }
  parallel.world->all_reduce(costs, ReduceOp::kSum);
  costs /= parallel.grid.dp();
  std::vector<ActionCosts> by_virtual_stage;
  for (int vs = 0; vs < virtual_stages; ++vs)
    by_virtual_stage.push_back({costs[vs][0].item<double>(), costs[vs][1].item<double>(), costs[vs][2].item<double>()});
  return by_virtual_stage;
}

// The bubble of each pipeline (pipeline/bubble.h) from its stages' waits and spans in the
// interval, averaged over the data-parallel replicas.
double measured_bubble(PipelineExecutor& executor, ParallelContext& parallel) {
  const auto [waited, span] = executor.take_wait_and_span();
  torch::Tensor all = torch::zeros({parallel.grid.dp(), parallel.grid.pp(), 2}, torch::kFloat64);
  all[parallel.coord.dp][parallel.coord.pp][0] = waited;
  all[parallel.coord.dp][parallel.coord.pp][1] = span;
  parallel.world->all_reduce(all, ReduceOp::kSum);
  double sum = 0;
  for (int replica = 0; replica < parallel.grid.dp(); ++replica) {
    std::vector<StageWaits> stages;
    for (int stage = 0; stage < parallel.grid.pp(); ++stage)
      stages.push_back({all[replica][stage][0].item<double>(), all[replica][stage][1].item<double>()});
    sum += pipeline_bubble(stages);
  }
  return sum / parallel.grid.dp();
}

}  // namespace

StepReport::FieldSource pipeline_bubble_field(PipelineExecutor& executor, ParallelContext& parallel) {
  return [&executor, &parallel](nlohmann::json& record) {
    record["pipeline_idle"] = measured_bubble(executor, parallel);
    // Beside it, what the schedule would idle if its actions took the times measured and the
    // transfers none (the simulator), and those times.
    SimulationCosts costs;
    costs.per_virtual_stage = measured_action_costs(executor, parallel);
    const SimulationResult predicted = simulate(executor.training_schedule(), costs);
    if (!predicted.deadlock) record["pipeline_idle_predicted"] = predicted.bubble_fraction;
    // One number per virtual stage, in their order.
    for (const ActionCosts& c : costs.per_virtual_stage) {
      record["pipeline_forward_ms"].push_back(1000 * c.forward);
      record["pipeline_backward_ms"].push_back(1000 * c.backward);
      if (executor.training_schedule().splits_backward()) record["pipeline_weight_ms"].push_back(1000 * c.weight);
    }
  };
}

StepReport::FieldSource expert_balance_field(const MoeBalancing& balancing) {
  return [&balancing](nlohmann::json& record) {
    auto add = [&](const char* key, const std::vector<std::pair<int64_t, double>>& values) {
      nlohmann::json by_layer = nlohmann::json::object();
      for (const auto& [layer, value] : values) by_layer[std::to_string(layer)] = value;
      if (!by_layer.empty()) record[key] = by_layer;
    };
    add("expert_load_max_over_mean", balancing.expert_balance());  // 1 is perfect balance
    add("ep_load_max_over_mean", balancing.ep_rank_balance());
    add("ep_ranks_per_token", balancing.ep_ranks_per_token());
  };
}

StepReport::FieldSource expert_exchange_field(const LanguageModelStage& stage, PipelineExecutor& executor,
                                              ParallelContext& parallel, int64_t start_step) {
  auto last_step = std::make_shared<int64_t>(start_step);
  return [&stage, &executor, &parallel, last_step](nlohmann::json& record) {
    // The interval's training passes only: evaluation's exchanges are not counted.
    double seconds = 0;
    for (auto [index, moe] : stage.moe_layers()) {
      seconds += moe->exchange_seconds();
      moe->reset_exchange_seconds();
    }
    const int64_t step = record["step"].get<int64_t>();
    const double interval = record["step_time_s"].get<double>() * static_cast<double>(step - *last_step);
    *last_step = step;
    // [share of the interval, exchange seconds, of them hidden by the other lane of a pair]
    torch::Tensor sums = torch::tensor({interval > 0 ? seconds / interval : 0.0, seconds,
                                        executor.take_hidden_exchange_seconds()}, torch::kFloat64);
    parallel.world->all_reduce(sums, ReduceOp::kSum);
    record["expert_exchange_share"] = sums[0].item<double>() / parallel.world->size();
    if (executor.pairs_side_by_side() && sums[1].item<double>() > 0)
      record["expert_exchange_hidden"] = sums[2].item<double>() / sums[1].item<double>();
  };
}

StepReport::FieldSource data_parallel_comm_field(const ModelGradients& grads, ParallelContext& parallel,
                                                 bool host_clocks) {
  auto last = std::make_shared<CommunicationRecord>(grads.communication());
  return [&grads, &parallel, last, host_clocks](nlohmann::json& record) {
    const CommunicationRecord now = grads.communication();
    const double steps = static_cast<double>(std::max<int64_t>(1, now.steps - last->steps));
    torch::Tensor per_step = torch::tensor({(now.in_flight_s - last->in_flight_s) / steps,
                                            (now.exposed_s - last->exposed_s) / steps,
                                            static_cast<double>(now.bytes_sent - last->bytes_sent) / steps},
                                           torch::kFloat64);
    *last = now;
    parallel.world->all_reduce(per_step, ReduceOp::kAvg);
    if (host_clocks) {
      record["dp_comm_s"] = per_step[0].item<double>();
      record["dp_comm_exposed_s"] = per_step[1].item<double>();
    }
    record["dp_comm_bytes"] = per_step[2].item<double>();
  };
}

double StepReport::tokens_per_s() const {
  const Throughput& steady = logged_intervals_ > 1 ? later_ : first_;
  return steady.tokens / steady.seconds;
}

}  // namespace dstrain
