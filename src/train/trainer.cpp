#include "dstrain/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <csignal>
#include <thread>
#include <cmath>
#include <functional>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/checkpoint_writer.h"
#include "dstrain/ckpt/gather.h"
#include "dstrain/core/accelerator.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/data/corpus.h"
#include "dstrain/data/loader.h"
#include "dstrain/dist/device.h"
#include "dstrain/dist/mpi_check.h"
#include "dstrain/dist/parallel_context.h"
#include "dstrain/model/cuda_kernels.h"
#include "dstrain/model/flops.h"
#include "dstrain/model/transformer.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/optim/gradients.h"
#include "dstrain/optim/loss_scaler.h"
#include "dstrain/optim/lr_schedule.h"
#include "dstrain/pipeline/executor.h"
#include "dstrain/pipeline/partition.h"
#include "dstrain/train/agreed_phase.h"
#include "dstrain/train/checkpointing.h"
#include "dstrain/train/evaluation.h"
#include "dstrain/train/metrics.h"
#include "dstrain/train/progress.h"
#include "dstrain/train/signals.h"
#include "dstrain/train/tensorboard.h"
#include "dstrain/train/train_config.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string parameter_digest(const NamedTensors& params) {
  uint64_t hash = 0xcbf29ce484222325ull;
  auto feed = [&](const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  };
  for (const auto& [name, param] : params) {
    torch::Tensor cpu = param.detach().to(torch::kCPU).contiguous();
    feed(name.data(), name.size());
    feed(cpu.data_ptr(), cpu.nbytes());
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string with_commas(double value) {
  std::string digits = std::to_string(std::llround(value));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out) throw config_error("run.dir", path, "cannot write this file");
}

// One step's results, still on the device: the host reads them only when it logs.
struct StepTensors {
  torch::Tensor loss;       // this rank's mean next-token loss over its micro-batches
  torch::Tensor mtp_loss;   // ... and multi-token prediction loss (0 on the other stages; undefined without MTP)
  torch::Tensor balance_loss;  // MoE: this stage's layers' balance losses, summed (undefined without aux_loss_alpha)
  torch::Tensor grad_norm;  // global, before clipping
};

// Steps since the last log line, timed from the moment the previous one had synchronised, less
// the evaluations and checkpoint saves between log lines; and the sums of their losses, on the
// device (the log line reports their mean, as Megatron-LM does, not the last step's alone).
struct Interval {
  Clock::time_point start = Clock::now();
  int64_t steps = 0;
  double excluded_seconds = 0;
  torch::Tensor loss_sum, mtp_loss_sum, balance_loss_sum, taken_steps;  // fp64; skipped steps left out

  void add(const StepTensors& step) {
    const torch::Tensor taken = step.grad_norm.isfinite();
    auto kept = [&](const torch::Tensor& loss) {
      const torch::Tensor value = loss.to(torch::kFloat64);
      return torch::where(taken, value, torch::zeros_like(value));
    };
    auto accumulate = [](torch::Tensor& sum, const torch::Tensor& value) { sum = sum.defined() ? sum + value : value; };
    ++steps;
    accumulate(loss_sum, kept(step.loss));
    if (step.mtp_loss.defined()) accumulate(mtp_loss_sum, kept(step.mtp_loss));
    if (step.balance_loss.defined()) accumulate(balance_loss_sum, kept(step.balance_loss));
    accumulate(taken_steps, taken.to(torch::kFloat64));
  }
  // The mean over the steps taken; the last step's value when every step was skipped.
  static torch::Tensor mean(const torch::Tensor& sum, const torch::Tensor& taken, const torch::Tensor& last) {
    return torch::where(taken > 0, sum / taken.clamp_min(1), last.to(torch::kFloat64));
  }
};

struct LoggedInterval {
  double loss = 0, seconds = 0, tokens = 0;
};

// The parameters of several model chunks, by global name in name order.
NamedTensors parameters_of(const std::vector<CausalLM>& chunks) {
  NamedTensors params;
  for (const CausalLM& chunk : chunks) {
    NamedTensors mine = sorted_parameters(*chunk);
    params.insert(params.end(), mine.begin(), mine.end());
  }
  std::sort(params.begin(), params.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return params;
}

class Trainer {
 public:
  // `resume`: the checkpoint to continue from ("": start afresh), the same on every rank;
  // `weights`: when starting afresh, the checkpoint whose model weights to start from ("": none).
  Trainer(const TrainConfig& config, const Options& effective, ParallelContext& parallel,
          const DevicePlacement& placement, const std::string& resume, const std::string& weights);
  // Makes run.dir and starts its config.ini, metrics and TensorBoard files (the reporting rank):
  // once every rank has started, so that a start that fails on any rank writes nothing there.
  void open_run_directory();
  TrainResult run();

 private:
  StepTensors train_step(int64_t step);
  // MoE: the expert loads of the step, summed over the data-parallel ranks, update the
  // balancing bias (noaux_tc), unless the step was `skipped`, and the balance the metrics report.
  // Returns the step's balance loss of this stage's layers (mean over micro-batches and
  // data-parallel ranks, summed over layers), or undefined without model.aux_loss_alpha.
  torch::Tensor balance_experts(const torch::Tensor& skipped);
  double evaluate();
  torch::Tensor next_batch(DataLoader& loader);
  uint64_t consumed_samples(int64_t step) const {
    return static_cast<uint64_t>(step) * static_cast<uint64_t>(config_.loop.global_batch);
  }
  // Stops the run (exit code 6) when a step since the last check had a non-finite gradient norm
  // (fp16 skips those; it stops when its loss scale has collapsed). Synchronises.
  void check_finite_steps(int64_t step);
  void resume_from(const std::string& path);
  // ckpt.load_weights: the parameters (their fp32 masters when the checkpoint has them) of a
  // checkpoint, the optimizer state fresh, step 0.
  void start_from_weights(const std::string& path);
  // What a checkpoint of the state after `step` records besides tensors (this rank's view).
  CheckpointState checkpoint_state(int64_t step) const;
  // Starts writing a checkpoint of the state after `step` (training goes on meanwhile).
  void save_checkpoint(int64_t step);
  // ckpt.save_final (reporting rank): the whole model after `step`, fp32, as a checkpoint of the
  // model alone in one file, like an import: eval, generate, export-hf and ckpt.load_weights take
  // it; continuing the run takes the optimizer state of its checkpoints.
  void write_final_model(int64_t step, const NamedTensors& model) const;
  // Every rank learns at this step boundary whether any was asked to stop (SIGTERM, SIGUSR1, SIGINT).
  bool stop_requested_anywhere();
  // debug.fail_*: the fault a test asked for, at the start of `step`.
  void inject_fault(int64_t step);
  bool fault_due(int64_t step, const char* mode) const {
    return config_.debug.fail_at_step == step && config_.debug.fail_mode == mode &&
           parallel_.world_rank == config_.debug.fail_rank;
  }
  // Synchronises, checks that the interval's steps were finite, writes the log line and the
  // metrics record. `earlier_seconds`: time spent in the steps before the interval (for the ETA).
  LoggedInterval log_interval(int64_t step, const StepTensors& tensors, const Interval& interval,
                              double earlier_seconds);

  TrainConfig config_;
  ParallelContext& parallel_;
  DevicePlacement placement_;
  bool is_reporting_rank_;
  Mixture train_data_;  // one corpus, or several in proportions (data.train = a.h5:0.7,b.h5:0.3)
  std::shared_ptr<const CorpusReader> valid_corpus_;
  std::unique_ptr<PipelineExecutor> executor_;  // this stage's model chunks and schedule
  NamedTensors params_;                          // of every chunk of this stage
  NamedTensors trainable_;                       // those the optimizer updates (not MoE's balancing bias)
  std::vector<std::pair<int64_t, MoE>> moe_layers_;  // of every chunk of this stage, by layer index
  torch::Tensor expert_balance_;                 // the last step's max/mean expert load of each MoE layer
  std::unique_ptr<GradientBuffer> grads_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<DynamicLossScaler> loss_scaler_;  // fp16 only
  torch::ScalarType wire_dtype_;
  torch::Tensor nonfinite_steps_;                   // steps whose gradient norm was not finite
  LrSchedule schedule_;
  LoaderOptions loader_options_;
  std::unique_ptr<DataLoader> loader_;  // on the stages that need tokens (first, last)
  MetricsLog metrics_;
  TensorBoardLog tensorboard_;  // the same records as metrics_, for TensorBoard
  std::string summary_path_;
  double flops_per_token_;
  double peak_flops_;  // of all devices together; 0: unknown
  std::string pipeline_text_;  // how the layers are spread, for the start-up report
  std::string corpus_fingerprint_;
  std::string config_text_;         // the effective configuration, for checkpoints
  std::string stage_layers_text_;   // layers per virtual stage, "2,2"
  std::unique_ptr<CheckpointWriter> checkpoints_;
  int64_t start_step_ = 0;  // the step a resumed run continues after
  int64_t last_logged_step_ = 0;
};

Trainer::Trainer(const TrainConfig& c, const Options& effective, ParallelContext& parallel,
                 const DevicePlacement& placement, const std::string& resume, const std::string& weights)
    : config_(c), parallel_(parallel), placement_(placement), is_reporting_rank_(parallel.world_rank == 0) {
  torch::set_num_threads(c.loop.threads);
  enable_cuda_kernels(c.loop.cuda_kernels);
  train_data_ = open_mixture(c.data.train, "data.train");
  if (!c.data.valid.empty()) valid_corpus_ = std::make_shared<CorpusReader>(c.data.valid);
  for (const auto& corpus : {train_data_.corpora.front(), valid_corpus_}) {  // the mixture shares one vocabulary
    if (corpus && corpus->info().vocab_size > static_cast<uint64_t>(c.model.vocab_size))
      throw config_error("model.vocab_size", std::to_string(c.model.vocab_size),
                         "smaller than the vocabulary of " + corpus->info().path + " (" +
                             std::to_string(corpus->info().vocab_size) + ", tokenizer " +
                             corpus->info().tokenizer + ")");
  }

  // Initialised in fp32 on the CPU from (seed, name) alone, then moved and rounded: the same
  // start on every device and layout.
  const torch::Device device = placement.device;
  const torch::ScalarType dtype = dtype_named(c.loop.precision);
  if (dtype == torch::kFloat16 && !device.is_cuda())
    throw config_error("train.precision", "fp16",
                       "LibTorch's CPU kernels have no fp16 matrix products; use bf16 on the CPU (fp16 runs on GPUs)");
  // This stage holds chunk c = virtual stage c × pp + stage, for each of its virtual_stages chunks.
  const int pp = parallel.grid.pp(), chunks_per_stage = c.parallel.virtual_stages, stage = parallel.coord.pp;
  const std::vector<LayerSlice> slices =
      partition_layers(c.model, c.loop.seq_len, pp * chunks_per_stage, c.parallel.stage_layers);
  std::vector<CausalLM> chunks;
  for (int chunk = 0; chunk < chunks_per_stage; ++chunk) {
    CausalLM model(c.model, slices[chunk * pp + stage]);
    initialize_parameters(*model, c.model, c.run.seed);
    model->to(device);
    cast_parameters(*model, dtype);
    chunks.push_back(model);
  }
  params_ = parameters_of(chunks);
  for (const auto& [name, p] : params_)
    if (p.requires_grad()) trainable_.emplace_back(name, p);
  for (const CausalLM& chunk : chunks)
    for (const auto& layer : chunk->moe_layers()) moe_layers_.push_back(layer);
  config_text_ = effective.to_ini();
  for (const LayerSlice& slice : slices)
    stage_layers_text_ += (stage_layers_text_.empty() ? "" : ",") + std::to_string(slice.last - slice.first);
  if (pp * chunks_per_stage > 1) {
    pipeline_text_ = "pipeline: " + std::to_string(pp) + " stages × " + std::to_string(chunks_per_stage) +
                     " chunk(s), schedule " + c.parallel.schedule + ", layers per virtual stage";
    for (const LayerSlice& slice : slices) pipeline_text_ += " " + std::to_string(slice.last - slice.first);
  }
  const ScheduleKind schedule = schedule_kind_named(c.parallel.schedule);
  const int microbatches = static_cast<int>(c.loop.grad_accum);
  executor_ = std::make_unique<PipelineExecutor>(
      make_schedule(schedule, pp, chunks_per_stage, microbatches),
      make_schedule(ScheduleKind::kForwardOnly, pp, chunks_per_stage, microbatches), stage, chunks,
      *parallel.pp_group, ActivationShape{c.loop.micro_batch, c.loop.seq_len, dtype, device});
  std::vector<torch::Tensor> use_order;  // chunk after chunk, each in the order it registered them
  for (const CausalLM& chunk : chunks)
    for (const torch::Tensor& p : chunk->parameters())
      if (p.requires_grad()) use_order.push_back(p);
  wire_dtype_ = dtype_named(c.comm.grad_dtype);
  grads_ = std::make_unique<GradientBuffer>(
      trainable_, use_order,
      GradientReduction{parallel.dp_group.get(), wire_dtype_, static_cast<int64_t>(c.comm.bucket_mb * (1 << 20)),
                        c.comm.overlap, c.loop.grad_accum, /*shard=*/c.optim.zero == 1});
  optimizer_ = std::make_unique<AdamW>(
      grads_->shards(), AdamWOptions{c.optim.beta1, c.optim.beta2, c.optim.eps, c.optim.weight_decay});
  if (c.loop.precision == "fp16")
    loss_scaler_ = std::make_unique<DynamicLossScaler>(c.optim.loss_scale, c.optim.loss_scale_growth_interval, device);
  nonfinite_steps_ = torch::zeros({}, torch::dtype(torch::kFloat32).device(device));
  schedule_ = {c.optim.lr, c.optim.min_lr, c.optim.warmup_steps, c.optim.decay_steps};

  flops_per_token_ = training_flops_per_token(c.model, c.loop.seq_len);
  double peak = c.loop.peak_tflops > 0 ? c.loop.peak_tflops : accel::known_peak_tflops(placement.name, c.loop.precision);
  peak_flops_ = peak * 1e12 * parallel.grid.world();

  loader_options_.seq_len = c.loop.seq_len;
  loader_options_.layout = {static_cast<uint64_t>(c.loop.micro_batch), static_cast<uint64_t>(c.loop.grad_accum),
                            static_cast<uint64_t>(parallel.grid.dp()), static_cast<uint64_t>(parallel.coord.dp)};
  loader_options_.seed = c.run.seed;
  loader_options_.model_vocab = c.model.vocab_size;
  loader_options_.prefetch_depth = c.data.prefetch;
  loader_options_.pinned_for_gpu = device.is_cuda() ? device.index() : -1;
  corpus_fingerprint_ = train_data_.fingerprint();
  checkpoints_ = std::make_unique<CheckpointWriter>(c.ckpt.dir, RetentionPolicy{c.ckpt.keep_last, c.ckpt.keep_every},
                                                    parallel);
  if (!resume.empty()) {
    resume_from(resume);
    if (!c.ckpt.load_weights.empty())
      log::info("ckpt.load_weights = ", c.ckpt.load_weights, " left aside: the run continues from its own checkpoint");
  } else if (!weights.empty()) {
    start_from_weights(weights);
  }
  if (executor_->needs_batches())
    loader_ = std::make_unique<DataLoader>(train_data_, loader_options_, /*start_step=*/start_step_);
  if (valid_corpus_) {
    const int64_t available = global_batches_in(*valid_corpus_, c.loop.seq_len, c.loop.global_batch);
    if (available == 0)
      throw data_error(c.data.valid + ": too small for one global batch of " +
                       std::to_string(c.loop.global_batch) + " sequences of " +
                       std::to_string(c.loop.seq_len + 1) + " tokens");
    if (available < c.loop.eval_batches) {
      log::warning("train.eval_batches = ", c.loop.eval_batches, ": ", c.data.valid, " holds only ",
                   available, " global batches; evaluating on those");
      config_.loop.eval_batches = available;
    }
  }
}

void Trainer::open_run_directory() {
  // A run already at train.steps (a requeued job that had finished, say) trains nothing: its run
  // directory keeps the configuration and logs of the run that did.
  if (!is_reporting_rank_ || start_step_ >= config_.loop.steps) return;
  const std::string& dir = config_.run.dir;
  std::string why;
  if (!files::make_directories(dir, &why)) throw config_error("run.dir", dir, "cannot create this directory (" + why + ")");
  if (start_step_ == 0 && files::is_regular_file(dir + "/metrics.jsonl"))
    log::warning("run.dir = ", dir, " holds the logs of an earlier run, and this one starts at step 0: it replaces ",
                 "their config.ini, metrics.jsonl and summary.json; their TensorBoard files",
                 files::exists(dir + "/final_model.h5") ? " and final_model.h5" : "", " stay");
  write_text_file(dir + "/config.ini", config_text_);
  metrics_ = MetricsLog(dir + "/metrics.jsonl", start_step_);
  tensorboard_ = TensorBoardLog(dir, start_step_);
  summary_path_ = dir + "/summary.json";
}

torch::Tensor Trainer::next_batch(DataLoader& loader) {
  // Pinned host memory: the copy overlaps with the kernels already queued.
  return loader.next().to(placement_.device, /*non_blocking=*/true);
}

StepTensors Trainer::train_step(int64_t step) {
  grads_->zero();
  // Every micro-batch has the same number of tokens, so the mean of the micro-batch means is
  // the mean over the global batch whatever grad_accum, dp and pp are.
  std::vector<torch::Tensor> batches;
  auto batch = [&](int microbatch) {
    if (batches.empty())
      for (int64_t i = 0; i < config_.loop.grad_accum; ++i) batches.push_back(next_batch(*loader_));
    return batches[static_cast<size_t>(microbatch)];
  };
  torch::Tensor loss_scale = loss_scaler_ ? loss_scaler_->scale() : torch::Tensor();
  if (fault_due(step, "nan"))  // the gradients of this rank's backward passes become NaN
    loss_scale = torch::full({}, std::numeric_limits<float>::quiet_NaN(), torch::dtype(torch::kFloat32).device(placement_.device));
  torch::Tensor loss_sum = executor_->train_step(batch, static_cast<double>(config_.loop.grad_accum), loss_scale);
  grads_->reduce();
  torch::Tensor norm = global_grad_norm(*grads_, parallel_.pp_group.get());
  // A step whose gradient norm is not finite changes nothing (the optimizer skips it on the
  // device); the next log line reports it, and stops the run unless fp16 overflow explains it.
  torch::Tensor found_inf = norm.isfinite().logical_not().to(torch::kFloat32);
  nonfinite_steps_ += found_inf;
  // fp16: the gradients still carry the loss scale; the optimizer divides it out with clipping's.
  // (No divisor at all without either: the fused kernel would write every gradient back.)
  if (loss_scaler_) norm = norm / loss_scaler_->scale();
  torch::Tensor divisor;
  if (config_.optim.grad_clip > 0) divisor = clip_divisor(norm, config_.optim.grad_clip);
  if (loss_scaler_) divisor = divisor.defined() ? divisor * loss_scaler_->scale() : loss_scaler_->scale();
  optimizer_->step(schedule_.at(step), grads_->shard_grads(), found_inf, divisor);
  grads_->gather_parameters();  // ZeRO-1: every rank's updated shard to every rank
  if (loss_scaler_) loss_scaler_->update(found_inf);
  torch::Tensor balance_loss;
  if (!moe_layers_.empty()) balance_loss = balance_experts(found_inf);
  // Every stage reports each loss (zeros where it has none): the log line sums them over stages.
  if (config_.model.n_routed_experts > 0 && config_.model.aux_loss_alpha > 0 && !balance_loss.defined())
    balance_loss = torch::zeros_like(loss_sum);
  torch::Tensor mtp_loss;
  if (config_.model.num_nextn_predict_layers > 0)
    mtp_loss = executor_->has_loss() ? executor_->mtp_loss() : torch::zeros_like(loss_sum);
  return {loss_sum, mtp_loss, balance_loss, norm};
}

torch::Tensor Trainer::balance_experts(const torch::Tensor& skipped) {
  torch::NoGradGuard no_grad;
  // The whole step's expert loads (every micro-batch, every data-parallel rank) and, in a last
  // column, balance losses, in one reduction for all layers: the bias moves the same way on
  // every rank.
  std::vector<torch::Tensor> rows;
  for (auto& [index, moe] : moe_layers_)
    rows.push_back(torch::cat({moe->expert_load(), moe->balance_loss().reshape({1})}));
  torch::Tensor all = torch::stack(rows);
  parallel_.dp_group->all_reduce(all, ReduceOp::kSum);
  const int64_t experts = config_.model.n_routed_experts;
  const torch::Tensor loads = all.narrow(1, 0, experts);
  for (size_t i = 0; i < moe_layers_.size(); ++i)
    moe_layers_[i].second->update_bias(loads[static_cast<int64_t>(i)], config_.model.bias_update_speed, skipped);
  expert_balance_ = std::get<0>(loads.max(1)) / loads.mean(1);
  if (config_.model.aux_loss_alpha <= 0) return {};
  return all.select(1, experts).sum() / static_cast<double>(config_.loop.grad_accum * parallel_.grid.dp());
}

double Trainer::evaluate() {
  return evaluate_loss(*executor_, valid_corpus_, loader_options_, config_.loop.eval_batches, parallel_,
                       placement_.device);
}

LoggedInterval Trainer::log_interval(int64_t step, const StepTensors& tensors, const Interval& interval,
                                     double earlier_seconds) {
  // The only host synchronisation of the interval: the values below wait for its last step.
  // The losses are on the last stage: the sum over the stages brings them to every stage.
  std::vector<torch::Tensor> losses = {Interval::mean(interval.loss_sum, interval.taken_steps, tensors.loss)};
  if (tensors.mtp_loss.defined())
    losses.push_back(Interval::mean(interval.mtp_loss_sum, interval.taken_steps, tensors.mtp_loss));
  if (tensors.balance_loss.defined())
    losses.push_back(Interval::mean(interval.balance_loss_sum, interval.taken_steps, tensors.balance_loss));
  torch::Tensor loss = torch::stack(losses);
  parallel_.pp_group->all_reduce(loss, ReduceOp::kSum);
  parallel_.dp_group->all_reduce(loss, ReduceOp::kAvg);
  parallel_.pp_group->synchronize();
  parallel_.dp_group->synchronize();
  const double loss_value = loss[0].item<double>(), grad_norm = tensors.grad_norm.item<double>();
  const double seconds = seconds_since(interval.start) - interval.excluded_seconds;
  // A non-finite loss goes with a non-finite gradient norm: what check_finite_steps decides.
  if (!std::isfinite(loss_value) && !config_.optim.skip_nonfinite && !loss_scaler_)
    throw Error(ExitCode::kNumerical, "step " + std::to_string(step) + ": the loss is not finite (" +
                                          std::to_string(loss_value) + "); lower optim.lr or check the data");
  check_finite_steps(step);
  const double loss_scale = loss_scaler_ ? loss_scaler_->scale().item<double>() : 0.0;

  const double tokens = static_cast<double>(interval.steps * config_.loop.global_batch * config_.loop.seq_len);
  const double tokens_per_s = tokens / seconds, step_seconds = seconds / static_cast<double>(interval.steps);
  const double mean_step_seconds = (earlier_seconds + seconds) / static_cast<double>(step - start_step_);
  const int64_t steps = config_.loop.steps;
  std::string extra;
  char text[64];
  nlohmann::json record = {{"step", step},
                           {"loss", loss_value},
                           {"lr", schedule_.at(step)},
                           {"grad_norm", grad_norm},
                           {"tokens_per_s", tokens_per_s},
                           {"step_time_s", step_seconds},
                           {"consumed_samples", consumed_samples(step)},
                           {"tokens", consumed_samples(step) * static_cast<uint64_t>(config_.loop.seq_len)}};
  if (tensors.mtp_loss.defined()) {
    const double mtp_loss = loss[1].item<double>();
    record["mtp_loss"] = mtp_loss;
    std::snprintf(text, sizeof text, " | MTP loss %.4f", mtp_loss);
    extra += text;
  }
  if (tensors.balance_loss.defined()) {
    const double balance_loss = loss[static_cast<int64_t>(losses.size()) - 1].item<double>();
    record["balance_loss"] = balance_loss;
    std::snprintf(text, sizeof text, " | balance loss %.3g", balance_loss);
    extra += text;
  }
  if (peak_flops_ > 0) {
    const double mfu = flops_per_token_ * tokens_per_s / peak_flops_;
    record["mfu"] = mfu;
    std::snprintf(text, sizeof text, " | MFU %.1f%%", 100 * mfu);
    extra += text;
  }
  if (placement_.device.is_cuda()) {
    const double gib = static_cast<double>(accel::peak_allocated_bytes(placement_.device)) / (1 << 30);
    record["memory_gib"] = gib;
    std::snprintf(text, sizeof text, " | %.1f GiB", gib);
    extra += text;
  }
  if (parallel_.grid.pp() > 1) {
    // The share of the steps' time each stage's device waited for its neighbours, averaged over
    // every rank: the bubble as it happened.
    const auto [waited, span] = executor_->take_wait_and_span();
    torch::Tensor idle = torch::full({1}, span > 0 ? waited / span : 0.0, torch::kFloat64);
    parallel_.world->all_reduce(idle, ReduceOp::kAvg);
    record["pipeline_idle"] = idle.item<double>();
    std::snprintf(text, sizeof text, " | bubble %.0f%%", 100 * idle.item<double>());
    extra += text;
  }
  if (expert_balance_.defined()) {
    // This stage's MoE layers: max/mean of the tokens their experts received in the last step
    // (1 is perfect balance), by layer index.
    torch::Tensor balance = expert_balance_.to(torch::kCPU, torch::kFloat64);
    nlohmann::json per_layer = nlohmann::json::object();
    double worst = 0;
    for (size_t i = 0; i < moe_layers_.size(); ++i) {
      const double value = balance[static_cast<int64_t>(i)].item<double>();
      per_layer[std::to_string(moe_layers_[i].first)] = value;
      worst = std::max(worst, value);
    }
    record["expert_load_max_over_mean"] = per_layer;
    std::snprintf(text, sizeof text, " | expert load max/mean %.2f", worst);
    extra += text;
  }
  if (loss_scaler_) {
    const int64_t skipped = static_cast<int64_t>(loss_scaler_->skipped_steps().item<float>());
    record["loss_scale"] = loss_scale;
    record["skipped_steps"] = skipped;
    std::snprintf(text, sizeof text, " | scale %.0f, %lld skipped", loss_scale, static_cast<long long>(skipped));
    extra += text;
  }
  char line[320];
  std::snprintf(line, sizeof line,
                "step %*lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | %.3f s/step%s | ETA %s",
                static_cast<int>(std::to_string(steps).size()), static_cast<long long>(step),
                static_cast<long long>(steps), loss_value, schedule_.at(step), grad_norm,
                with_commas(tokens_per_s).c_str(), step_seconds, extra.c_str(),
                format_duration(mean_step_seconds * static_cast<double>(steps - step)).c_str());
  log::info(line);
  metrics_.write(record);
  tensorboard_.write(record);
  return {loss_value, seconds, tokens};
}

void Trainer::check_finite_steps(int64_t step) {
  // A collective that hangs on a GPU surfaces here (after comm.timeout_s), not in the read below.
  parallel_.pp_group->synchronize();
  parallel_.dp_group->synchronize();
  const int64_t nonfinite = static_cast<int64_t>(nonfinite_steps_.item<float>());
  const std::string steps_text = "steps " + std::to_string(last_logged_step_ + 1) + "-" + std::to_string(step);
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
  last_logged_step_ = step;
}

void Trainer::resume_from(const std::string& path) {
  CheckpointReader reader(path);
  const CheckpointState& state = reader.state();
  check_resumable(reader, {model_shape_text(config_.model), config_.data.train, corpus_fingerprint_,
                           static_cast<uint64_t>(config_.loop.global_batch), static_cast<uint64_t>(config_.loop.seq_len),
                           config_text_});
  load_checkpoint(reader, *optimizer_, params_);
  grads_->gather_parameters();  // ZeRO-1: each rank loaded its shard of the weights
  if (loss_scaler_ && state.loss_scale > 0)
    loss_scaler_->restore(state.loss_scale, state.loss_scale_clean_steps, state.skipped_steps);
  // The generator states go back where they came from when the layout is the same.
  const RankGrid& grid = parallel_.grid;
  const bool same_layout = state.world_size == static_cast<uint64_t>(grid.world()) &&
                           state.dp == static_cast<uint64_t>(grid.dp()) && state.pp == static_cast<uint64_t>(grid.pp());
  if (same_layout) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle to the default
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.rng[parallel_.world_rank].contiguous());
  }
  start_step_ = state.step;
  last_logged_step_ = state.step;
  log::info("resuming from ", path, ": after step ", state.step, ", ", state.consumed_samples,
            " samples consumed; written by dp ", state.dp, " × pp ", state.pp, " (", state.schedule, ")",
            same_layout ? "" : ", continuing on this layout");
}

void Trainer::start_from_weights(const std::string& path) {
  CheckpointReader reader(path);
  load_weights(reader, *optimizer_, params_);
  grads_->gather_parameters();  // ZeRO-1: each rank loaded its shard of the weights
  log::info("starting from the weights of ", path, " (its step ", reader.state().step,
            "): fresh optimizer state, step 0");
}

CheckpointState Trainer::checkpoint_state(int64_t step) const {
  CheckpointState state;
  state.step = step;
  state.consumed_samples = consumed_samples(step);
  state.tokens = state.consumed_samples * static_cast<uint64_t>(config_.loop.seq_len);
  state.optimizer_steps = static_cast<uint64_t>(optimizer_->step_count());
  if (loss_scaler_) {
    state.loss_scale = loss_scaler_->scale().item<double>();
    state.loss_scale_clean_steps = loss_scaler_->clean_steps();
    state.skipped_steps = loss_scaler_->skipped_steps().item<double>();
  }
  state.global_batch = static_cast<uint64_t>(config_.loop.global_batch);
  state.seq_len = static_cast<uint64_t>(config_.loop.seq_len);
  state.config = config_text_;
  state.model_shape = model_shape_text(config_.model);
  state.corpus_path = config_.data.train;
  state.corpus_checksum = corpus_fingerprint_;
  state.tokenizer = train_data_.corpora.front()->info().tokenizer;  // a mixture's corpora share it
  state.world_size = static_cast<uint64_t>(parallel_.grid.world());
  state.dp = static_cast<uint64_t>(parallel_.grid.dp());
  state.pp = static_cast<uint64_t>(parallel_.grid.pp());
  state.virtual_stages = static_cast<uint64_t>(config_.parallel.virtual_stages);
  state.schedule = config_.parallel.schedule;
  state.stage_layers = stage_layers_text_;
  return state;
}

void Trainer::write_final_model(int64_t step, const NamedTensors& model) const {
  CheckpointState state = checkpoint_state(step);
  state.world_size = state.dp = state.pp = state.virtual_stages = 1;  // one file, one stage
  state.stage_layers = std::to_string(config_.model.num_layers);
  state.rng = at::detail::getDefaultCPUGenerator().get_state().reshape({1, -1});
  std::map<std::string, torch::Tensor> by_dataset;
  std::vector<std::string> datasets;
  for (const auto& [name, tensor] : model) {
    datasets.push_back("model/" + name);
    by_dataset["model/" + name] = tensor;
  }
  write_checkpoint_file(config_.run.dir + "/final_model.h5", datasets,
                        [&](const std::string& dataset) { return by_dataset.at(dataset).to(torch::kFloat32); }, state);
}

void Trainer::save_checkpoint(int64_t step) {
  check_finite_steps(step);  // a non-finite step never reaches a checkpoint
  CheckpointState state = checkpoint_state(step);
  CheckpointContents contents = checkpoint_contents(params_, *optimizer_, grads_->sharded());
  const double blocked = checkpoints_->begin(step, contents.replicated, contents.owned, std::move(state),
                                             at::detail::getDefaultCPUGenerator().get_state());
  char text[96];
  std::snprintf(text, sizeof text, "checkpoint of step %lld: training blocked %.2f s; writing in the background",
                static_cast<long long>(step), blocked);
  log::info(text);
  if (fault_due(step, "kill_in_save")) std::raise(SIGKILL);
}

bool Trainer::stop_requested_anywhere() {
  torch::Tensor stop = torch::full({1}, signals::stop_requested() ? 1 : 0, torch::kInt32);
  parallel_.world->all_reduce(stop, ReduceOp::kMax);
  return stop.item<int>() != 0;
}

void Trainer::inject_fault(int64_t step) {
  if (fault_due(step, "kill")) std::raise(SIGKILL);
  if (fault_due(step, "sigterm")) std::raise(SIGTERM);
  if (fault_due(step, "sigint")) std::raise(SIGINT);
  if (fault_due(step, "hang")) {
    log::error("debug.fail_mode = hang: rank ", parallel_.world_rank, " stops answering at step ", step);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
  }
}

TrainResult Trainer::run() {
  const int64_t steps = config_.loop.steps;
  const ParameterCounts counts = count_parameters(config_.model);
  char flops[32];
  std::snprintf(flops, sizeof flops, "%.3g", flops_per_token_);
  log::info("model: ", with_commas(static_cast<double>(counts.total)), " parameters, ", flops,
            " FLOP per token (training); ", config_.loop.precision, " on ",
            placement_.device.str(), " (", placement_.name, "), comm ", parallel_.dp_group->backend());
  if (!pipeline_text_.empty()) log::info(pipeline_text_);
  char state[128];
  std::snprintf(state, sizeof state, "optimizer state: %.1f MiB on rank 0%s", optimizer_->state_bytes() / 1048576.0,
                grads_->sharded() ? ", sharded over the data-parallel ranks (ZeRO-1)" : "");
  log::info(state);
  log::info("training ", steps, " steps: global batch ", config_.loop.global_batch, " × ",
            config_.loop.seq_len, " tokens (micro_batch ", config_.loop.micro_batch, " × grad_accum ",
            config_.loop.grad_accum, " × dp ", parallel_.grid.dp(), "), ",
            with_commas(static_cast<double>(train_data_.n_tokens())), " tokens in ",
            config_.data.train);
  if (train_data_.corpora.size() > 1) {
    // What each corpus gives the run: its share of the samples, and how often that goes through it.
    const double run_samples = static_cast<double>(steps) * static_cast<double>(config_.loop.global_batch);
    for (size_t c = 0; c < train_data_.corpora.size(); ++c) {
      const CorpusInfo& info = train_data_.corpora[c]->info();
      const double samples = static_cast<double>(samples_in_corpus(info.n_tokens, config_.loop.seq_len));
      char text[96];
      std::snprintf(text, sizeof text, "%.1f%% of the samples, %.2f epochs of its ", 100 * train_data_.weights[c],
                    train_data_.weights[c] * run_samples / samples);
      log::info("  ", info.path, ": ", text, with_commas(samples));
    }
  }
  TrainResult result;
  const Clock::time_point start = Clock::now();
  double trained_seconds = 0;  // in training steps, evaluation left out
  LoggedInterval first, later; // the first interval pays for warm-up: throughput comes from the others
  int64_t logged_intervals = 0;
  Interval interval;
  if (start_step_ >= steps) {
    // A requeued job whose run had already finished: the run directory stays as it was.
    log::info("the checkpoint is at step ", start_step_, " of train.steps = ", steps, ": nothing to do");
    result.steps = start_step_;
    return result;
  }
  ProgressLine progress(start_step_, steps, static_cast<double>(config_.loop.global_batch * config_.loop.seq_len));
  for (int64_t step = start_step_ + 1; step <= steps; ++step) {
    inject_fault(step);
    StepTensors tensors;
    const bool forbid_host_sync = config_.debug.forbid_host_sync && placement_.device.is_cuda();
    try {
      // Without host synchronisation the host queues the next step's kernels while the GPU runs
      // this one's; the log interval below is where it waits.
      accel::HostSyncForbidden no_waiting(forbid_host_sync);
      tensors = train_step(step);
    } catch (const c10::Error& e) {
      // LibTorch's message says only that an operation synchronised; its backtrace says which.
      const bool waited = std::string(e.what()).find("synchronizing CUDA operation") != std::string::npos;
      if (!forbid_host_sync || !waited) throw;
      throw Error(ExitCode::kInternal, "debug.forbid_host_sync: step " + std::to_string(step) +
                                           " made the host wait for the GPU: " + e.what());
    }
    interval.add(tensors);
    progress.step_done(step);
    const bool log_due = step % config_.log.interval == 0 || step == steps;
    if (log_due) {
      LoggedInterval logged = log_interval(step, tensors, interval, trained_seconds);
      trained_seconds += logged.seconds;
      LoggedInterval& sum = logged_intervals++ == 0 ? first : later;
      sum.seconds += logged.seconds;
      sum.tokens += logged.tokens;
      result.final_loss = logged.loss;
    }
    // Evaluations and saves between log lines stay out of the interval's time: the device first
    // finishes the steps queued before them. (After a log line the interval restarts anyway.)
    auto untimed = [&](const std::function<void()>& work) {
      if (log_due) return work();
      accel::synchronize(placement_.device);
      const Clock::time_point start = Clock::now();
      work();
      interval.excluded_seconds += seconds_since(start);
    };
    const bool eval_due = config_.loop.eval_interval > 0 && step % config_.loop.eval_interval == 0;
    if (valid_corpus_ && (eval_due || step == steps)) {
      untimed([&] {
        result.final_eval_loss = evaluate();
        log::info("eval at step ", step, " | loss ", result.final_eval_loss, " | perplexity ",
                  std::exp(result.final_eval_loss));
        const nlohmann::json record = {{"step", step}, {"eval_loss", result.final_eval_loss},
                                       {"eval_ppl", std::exp(result.final_eval_loss)}};
        metrics_.write(record);
        tensorboard_.write(record);
      });
    }
    // The step boundary: a finished background save completes; a signal stops the run here.
    checkpoints_->poll();
    if (step < steps && stop_requested_anywhere()) {
      // Slurm's warning before a time limit or preemption: a checkpoint, then "requeue me".
      save_checkpoint(step);
      checkpoints_->finish();
      log::info("stopped by ", signals::stop_requested() ? signals::requested_by() : "a signal to another rank",
                " after step ", step, ": checkpoint written; resubmit the job to continue (exit code 75)");
      result.requeue = true;
      result.steps = step;
      return result;
    }
    if (config_.ckpt.interval > 0 && (step % config_.ckpt.interval == 0 || step == steps))
      untimed([&] { save_checkpoint(step); });
    if (log_due) interval = Interval{};  // logging, evaluation and saving stay out of the timed steps
  }
  checkpoints_->finish();
  const double seconds = seconds_since(start);
  const LoggedInterval& steady = logged_intervals > 1 ? later : first;
  result.steps = steps;
  result.tokens_per_s = steady.tokens / steady.seconds;
  result.mfu = peak_flops_ > 0 ? flops_per_token_ * result.tokens_per_s / peak_flops_ : 0.0;
  result.peak_memory_bytes = accel::peak_allocated_bytes(placement_.device);
  // The whole model on rank 0, whatever the layout: its digest, and the file if asked for.
  const NamedTensors model = gather_parameters(params_, parallel_);
  if (is_reporting_rank_) {
    result.param_digest = parameter_digest(model);
    if (config_.ckpt.save_final) write_final_model(steps, model);
  }
  const uint64_t tokens = consumed_samples(steps) * static_cast<uint64_t>(config_.loop.seq_len);

  log::info("done: ", steps, " steps in ", format_duration(seconds), ", ",
            with_commas(static_cast<double>(tokens)), " tokens (",
            with_commas(result.tokens_per_s), " tok/s after warm-up); final loss ", result.final_loss,
            valid_corpus_ ? ", eval loss " + std::to_string(result.final_eval_loss) : std::string());
  if (is_reporting_rank_) {
    nlohmann::json summary = {{"steps", steps},
                              {"tokens", tokens},
                              {"seconds", seconds},
                              {"tokens_per_s", result.tokens_per_s},
                              {"final_loss", result.final_loss},
                              {"param_digest", result.param_digest},
                              {"precision", config_.loop.precision},
                              {"device", placement_.name},
                              {"layout",
                               {{"dp", parallel_.grid.dp()},
                                {"pp", parallel_.grid.pp()},
                                {"schedule", config_.parallel.schedule},
                                {"virtual_stages", config_.parallel.virtual_stages}}}};
    summary["optimizer_state_bytes"] = optimizer_->state_bytes();  // rank 0's
    if (valid_corpus_) summary["final_eval_loss"] = result.final_eval_loss;
    if (result.mfu > 0) summary["mfu"] = result.mfu;
    if (result.peak_memory_bytes > 0) summary["peak_memory_bytes"] = result.peak_memory_bytes;
    write_text_file(summary_path_, summary.dump(2) + "\n");
    log::info("metrics: ", metrics_.path(), "  config: ", config_.run.dir, "/config.ini  summary: ",
              summary_path_, config_.ckpt.save_final ? "  model: " + config_.run.dir + "/final_model.h5" : "");
  }
  return result;
}

// A checkpoint directory holding checkpoints but no `latest` (written by hand, or a crash between
// the first checkpoint's rename and its `latest`): the run starts afresh, and its saves will
// replace files of the same step.
void warn_of_checkpoints_without_latest(const std::string& dir) {
  std::string newest;
  int64_t newest_step = -1;
  for (const std::string& name : files::directory_entries(dir)) {
    const int64_t step = step_of_checkpoint_file(name);  // -1 for other names
    if (step > newest_step) newest = name, newest_step = step;
  }
  if (!newest.empty())
    log::warning("ckpt.dir = ", dir, " holds checkpoints (the newest ", newest, ") but no `latest`: starting afresh; "
                 "set ckpt.resume to one of them to continue from it");
}

}  // namespace

TrainResult run_training(Options options) {
  int world_size = 1, world_rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  signals::install();  // (again: MPI's start-up may have installed handlers of its own)

  TrainConfig config;
  DevicePlacement placement;
  std::string backend;
  std::optional<ParallelContext> parallel;
  std::unique_ptr<Trainer> trainer;
  agreed_phase(world_rank, [&] {  // this rank alone: the configuration
    config = read_train_config(options, world_size);
    log::configure(world_rank, world_size, config.log.all_ranks);
  });
  agreed_phase(world_rank, [&] {  // this rank's device (after one collective that cannot fail alone)
    placement = place_rank(config.loop.device);
    backend = resolve_backend(config.comm.backend, placement.device);
  });
  agreed_phase(world_rank, [&] {  // collective: communicators (their checks fail on every rank alike)
    log::info("dstrain ", DSTRAIN_VERSION, ": ", world_size, " rank(s), dp ", config.parallel.dp, " × pp ",
              config.parallel.pp, "\neffective configuration:\n", options.to_ini());
    parallel.emplace(ParallelContext::create(RankGrid(world_size, config.parallel.dp, config.parallel.pp,
                                                      config.parallel.order),
                                             backend, placement.device, config.comm.timeout_s));
  });
  // Which checkpoint to continue from: decided by rank 0 alone, so that ranks that see a shared
  // file system at different moments cannot disagree. Its checkpoint directory is made now, so
  // that an unusable ckpt.dir is found at the start, not at the first save.
  // A run with nothing to resume may start from another checkpoint's weights (fine-tuning).
  // A start that fails removes the directories it made (a mistyped corpus leaves no run behind).
  std::string resume, weights;
  std::vector<std::string> made_directories;
  try {
    agreed_phase(world_rank, [&] {
      if (world_rank != 0) return;
      std::string why;
      if (!files::make_directories(config.ckpt.dir, &why, &made_directories)) {
        if (config.ckpt.dir_in_run_dir)
          throw config_error("run.dir", config.run.dir, "cannot create " + config.ckpt.dir + " (" + why + ")");
        throw config_error("ckpt.dir", config.ckpt.dir, "cannot create this directory (" + why + ")");
      }
      resume = resolve_resume(config.ckpt.resume, config.ckpt.dir);
      if (resume.empty() && config.ckpt.resume == "auto") warn_of_checkpoints_without_latest(config.ckpt.dir);
      if (resume.empty() && !config.ckpt.load_weights.empty())
        weights = resolve_checkpoint(config.ckpt.load_weights, "ckpt.load_weights");
    });
    resume = parallel->world->broadcast_string(resume, 0);
    weights = parallel->world->broadcast_string(weights, 0);
    agreed_phase(world_rank, [&] {  // this rank alone: files, model, optimizer
      trainer = std::make_unique<Trainer>(config, options, *parallel, placement, resume, weights);
    });
    agreed_phase(world_rank, [&] { trainer->open_run_directory(); });
  } catch (...) {
    files::remove_empty_directories(made_directories);
    throw;
  }

  // Training: an error now is this rank's alone and the others are inside collectives; the
  // rank says what happened and ends the job.
  try {
    return trainer->run();
  } catch (const std::exception& e) {
    const Error error = as_error(e);
    if (world_size == 1) throw error;
    log::error(error.what());
    MPI_Abort(MPI_COMM_WORLD, static_cast<int>(error.code()));
    throw;
  }
}

}  // namespace dstrain
