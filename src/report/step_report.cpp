#include "dstrain/report/step_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/log.h"
#include "dstrain/report/metrics.h"

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
  Communicator &stages = parallel_.group(Group::kPp), &readers = parallel_.group(Group::kDpCp);
  stages.all_reduce(values, ReduceOp::kSum);
  readers.all_reduce(values, ReduceOp::kAvg);  // over the ranks that read other data
  stages.synchronize();
  readers.synchronize();
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

double StepReport::tokens_per_s() const {
  const Throughput& steady = logged_intervals_ > 1 ? later_ : first_;
  return steady.tokens / steady.seconds;
}

}  // namespace dstrain
