// The step report: each log interval's statistics (summed on the device, read once at the log
// step), the record of the interval and of each evaluation, and the sinks every record goes to:
// the console's log line, metrics.jsonl and TensorBoard. Other components add fields to a record
// through field sources (the pipeline's bubble, the expert balance, the fp16 loss scale) and
// nothing else writes a record.
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
#include "dstrain/optim/lr_schedule.h"
#include "dstrain/optim/moe_balancing.h"
#include "dstrain/pipeline/executor.h"
#include "dstrain/train/language_model_stage.h"
#include "dstrain/train/model_gradients.h"
#include "dstrain/train/report_sink.h"

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
  // The log step: the interval's means summed over the stages, averaged over the data-parallel
  // ranks: the only host synchronisation of the interval. Returns the interval's mean loss.
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

// The share of the steps' time each stage's device waited for its neighbours, averaged over
// every rank: the pipeline's bubble as it happened (collective over the world).
StepReport::FieldSource pipeline_bubble_field(PipelineExecutor& executor, ParallelContext& parallel);
// This stage's MoE layers: max/mean of the tokens their experts received in the last step, and
// under expert parallelism the same for the expert-parallel ranks and the ranks a token reached.
StepReport::FieldSource expert_balance_field(const MoeBalancing& balancing);
// Expert parallelism: the share of the interval's time spent exchanging tokens (dispatch and
// combine, forward and backward, waits for peers included), averaged over every rank (collective);
// with DualPipeV's pairs side by side, the share of that time the other lane's computation hid.
// `start_step`: the step the run continues after.
StepReport::FieldSource expert_exchange_field(const LanguageModelStage& stage, PipelineExecutor& executor,
                                              ParallelContext& parallel, int64_t start_step);
// The data-parallel gradient reduction, per step of the interval and averaged over every rank
// (collective): the bytes a rank sent, and with `host_clocks` (the MPI backend) the time a bucket
// was under way and the part the step waited for after its backward pass (what overlap did not
// hide).
StepReport::FieldSource data_parallel_comm_field(const ModelGradients& grads, ParallelContext& parallel,
                                                 bool host_clocks);

}  // namespace dstrain
