// The step report: each log interval's statistics (summed on the device, read once at the log
// step), the record of the interval and of each evaluation, and the sinks every record goes to:
// the console's log line, metrics.jsonl and TensorBoard. The components add the fields they
// measure to a record through field sources they register (train/report_fields.h: the pipeline's
// bubble, the expert balance and exchange, the data-parallel reduction, the fp16 loss scale), as
// torchtitan's metrics processor takes its components' metrics; nothing else writes a record.
#pragma once

#include <nlohmann/json.hpp>

#include "dstrain/core/torch_api.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/parallel/parallel_context.h"
#include "dstrain/report/report_sink.h"

namespace dstrain {

// One step's results, still on the device: the host reads them only when it logs.
struct StepResult {
  // 0-dim, by name, this stage's share (0 where it has none; the report sums over the stages):
  // the executor's losses ("loss" first), then the post-step hooks' values. The same names on
  // every rank and step.
  std::vector<std::pair<std::string, torch::Tensor>> values;
  torch::Tensor grad_norm;  // global, before clipping; not finite: the optimizer skipped the step
  int64_t samples = 0;      // the step's global batch
  double lr = 0;            // the learning rate it trained at
};

// The log line a person reads: "step 5/20 | loss 4.1234 | ...", "eval at step 10 | loss ...".
class ConsoleSink : public ReportSink {
 public:
  // The run trains steps (start_step, total_steps]: for the ETA.
  ConsoleSink(int64_t start_step, int64_t total_steps);
  void write(const nlohmann::json& record) override;

 private:
  int64_t start_step_, total_steps_, last_step_;
  double trained_seconds_ = 0;  // in the logged intervals so far
};

struct StepReportSettings {
  int64_t start_step = 0, total_steps = 0, log_interval = 1;
  int64_t seq_len = 0;
  double flops_per_token = 0, peak_flops = 0;  // peak of all devices together; 0: unknown
  torch::Device device = torch::kCPU;
  int64_t start_consumed = 0;   // samples consumed before start_step
  bool reports_global_batch = false;  // a batch-size ramp-up: each record says the step's batch
};

class StepReport {
 public:
  using Clock = std::chrono::steady_clock;
  using FieldSource = std::function<void(nlohmann::json& record)>;

  StepReport(const StepReportSettings& settings, ParallelContext& parallel);
  void add_sink(std::unique_ptr<ReportSink> sink) { sinks_.push_back(std::move(sink)); }
  // Called at every log step, on every rank in the same order (a source may be collective).
  void add_field_source(FieldSource source) { sources_.push_back(std::move(source)); }

  // The first step begins: the first interval is timed from here.
  void start() { interval_ = Interval{}; }
  void add(const StepResult& step);
  bool due(int64_t step) const { return step % settings_.log_interval == 0 || step == settings_.total_steps; }
  // The log step: the interval's means summed over the stages (pp), averaged over the ranks that
  // read other data (dp-cp): the only host synchronisation of the interval. Returns the interval's
  // mean loss.
  double measure(int64_t step, const StepResult& last);
  // Completes the measured interval's record (the field sources) and writes it to every sink.
  void write();
  // Work between log steps (an evaluation, a save) is left out of the interval's time.
  void untimed(int64_t step, const std::function<void()>& work);
  // The end of a step: after a log step the next interval starts, its time measured from here,
  // so that logging, evaluation and saving stay out of the timed steps.
  void finish_step(int64_t step);
  void write_evaluation(int64_t step, double loss);

  // After the run: the throughput of the intervals after the first (which pays for warm-up),
  // or of the only one; the last logged mean loss.
  double tokens_per_s() const;
  double final_loss() const { return final_loss_; }

 private:
  struct Interval {
    Clock::time_point start = Clock::now();
    int64_t steps = 0, samples = 0;
    double excluded_seconds = 0;
    std::vector<torch::Tensor> sums;  // fp64, by value; skipped steps left out
    torch::Tensor taken_steps;
  };
  struct Throughput {
    double seconds = 0, tokens = 0;
  };

  StepReportSettings settings_;
  ParallelContext& parallel_;
  std::vector<std::unique_ptr<ReportSink>> sinks_;
  std::vector<FieldSource> sources_;
  Interval interval_;
  nlohmann::json measured_;  // the record of the interval measure() read
  Throughput first_, later_;
  int64_t logged_intervals_ = 0;
  double final_loss_ = 0;
  int64_t consumed_ = 0;  // samples of the steps so far
  StepResult last_{};     // the last step's batch and learning rate
};

}  // namespace dstrain
