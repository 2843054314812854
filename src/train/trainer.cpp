// `dstrain train`: the loop, which asks each component whether it is due (the step report, the
// validator, the train state's saves, the guards), and the start-up that builds them.
#include "dstrain/train/trainer.h"

#include <chrono>
#include <memory>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/core/log_writer.h"
#include "dstrain/core/step_memory.h"
#include "dstrain/data/corpus.h"
#include "dstrain/data/loader.h"
#include "dstrain/data/mixture.h"
#include "dstrain/parallel/agreed_phase.h"
#include "dstrain/parallel/deadline.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/optim/gradients.h"
#include "dstrain/optim/lr_schedule.h"
#include "dstrain/model/parameter_shapes.h"
#include "dstrain/optim/moe_balancing.h"
#include "dstrain/train/evaluation.h"
#include "dstrain/train/guards.h"
#include "dstrain/train/job.h"
#include "dstrain/train/memory_plan.h"
#include "dstrain/train/model_gradients.h"
#include "dstrain/report/progress.h"
#include "dstrain/report/run_directory.h"
#include "dstrain/train/report_fields.h"
#include "dstrain/train/run_summary.h"
#include "dstrain/train/step_profiler.h"
#include "dstrain/train/run_plan.h"
#include "dstrain/train/signals.h"
#include "dstrain/train/stage_builder.h"
#include "dstrain/report/step_report.h"
#include "dstrain/train/train_state.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;

// Token ids at or above model.vocab_size would index past the embedding.
void check_vocabulary(const ModelConfig& model, const std::vector<std::shared_ptr<const CorpusReader>>& corpora) {
  for (const auto& corpus : corpora)
    if (corpus && corpus->info().vocab_size > static_cast<uint64_t>(model.vocab_size))
      throw config_error("model.vocab_size", std::to_string(model.vocab_size),
                         "smaller than the vocabulary of " + corpus->info().path + " (" +
                             std::to_string(corpus->info().vocab_size) + ", tokenizer " + corpus->info().tokenizer +
                             ")");
}

// How the data-parallel group averages gradients (comm.*): 8-bit formats quantized in blocks,
// the others as a dtype on the wire.
GradientReduction gradient_reduction(const TrainConfig& c) {
  GradientReduction reduction;
  reduction.bucket_bytes = static_cast<int64_t>(c.comm.bucket_mb * (1 << 20));
  reduction.overlap = c.comm.overlap;
  reduction.microbatches = c.loop.grad_accum;
  reduction.shard = c.optim.zero == 1;
  switch (c.comm.grad_dtype) {
    case GradientWire::kInt8: reduction.quantized = BlockFormat::kInt8; break;
    case GradientWire::kFp8: reduction.quantized = BlockFormat::kFp8E4M3; break;
    case GradientWire::kBf16: reduction.wire_dtype = torch::kBFloat16; break;
    case GradientWire::kFp16: reduction.wire_dtype = torch::kFloat16; break;
    case GradientWire::kFp32: reduction.wire_dtype = torch::kFloat32; break;
  }
  reduction.error_feedback = c.comm.error_feedback;
  return reduction;
}

class Trainer {
 public:
  // `resume`: the checkpoint to continue from ("": start afresh), the same on every rank;
  // `weights`: when starting afresh, the checkpoint whose model weights to start from ("": none).
  Trainer(Job& job, const std::string& config_text, const std::string& resume, const std::string& weights);
  // Makes run.dir and starts its config.ini, metrics and TensorBoard files (the reporting rank):
  // once every rank has started, so that a start that fails on any rank writes nothing there.
  void open_run_directory();
  TrainResult run();

 private:
  TrainResult run_steps();
  // After a numerical error: the save in flight completes (see run()).
  void complete_save_in_flight();
  StepResult train_step(int64_t step);
  // One step, its activation memory measured; with debug.forbid_host_sync on a GPU, a wait for the
  // device inside it is an error.
  StepResult train_step_checked(int64_t step);
  void save_checkpoint(int64_t step);
  TrainResult finish(TrainResult result, Clock::time_point start);

  const TrainConfig& config_;
  ParallelContext& parallel_;
  const DevicePlacement placement_;
  std::string config_text_;
  Mixture train_data_;  // one corpus, or several in proportions (data.train = a.h5:0.7,b.h5:0.3)
  RankStage stage_;
  NamedTensors params_;
  std::unique_ptr<ModelGradients> grads_;
  std::unique_ptr<AdamW> optimizer_;
  std::vector<std::unique_ptr<PostStepHook>> post_step_hooks_;
  MoeBalancing* balancing_ = nullptr;  // MoE models: the balancing bias, among the hooks
  LrSchedule schedule_;
  RunPlan plan_;
  StepGuards guards_;
  std::unique_ptr<TrainState> state_;
  std::unique_ptr<DataLoader> loader_;  // on the stages that need tokens (first, last)
  std::unique_ptr<Validator> validator_;
  std::unique_ptr<StepReport> report_;
  accel::StepMemoryMeter step_memory_;
  StepProfiler profiler_;  // debug.profile
};

Trainer::Trainer(Job& job, const std::string& config_text, const std::string& resume, const std::string& weights)
    : config_(job.config), parallel_(*job.parallel), placement_(job.placement), config_text_(config_text),
      train_data_(open_mixture(job.config.data.train, "data.train")),
      guards_(job.config, *job.parallel, job.placement.device), step_memory_(job.placement.device),
      profiler_(job.config.debug.profile, job.parallel->world_rank(), job.placement.device) {
  const TrainConfig& c = config_;
  const torch::Device device = placement_.device;
  std::shared_ptr<const CorpusReader> valid;
  if (!c.data.valid.empty()) valid = std::make_shared<CorpusReader>(c.data.valid);
  check_vocabulary(c.model, {train_data_.corpora.front(), valid});  // the mixture shares one vocabulary
  stage_ = build_rank_stage(c, parallel_, device, Initialization::kFromSeed);
  params_ = stage_.parameters();
  NamedTensors trainable;  // those the optimizer updates (not MoE's balancing bias), experts stacked
  std::vector<torch::Tensor> use_order;  // chunk after chunk, each in the order it registered them
  for (const auto& [name, p] : stage_.module_parameters())
    if (p.requires_grad()) trainable.emplace_back(name, p);
  for (const CausalLM& chunk : stage_.chunks())
    for (const torch::Tensor& p : chunk->parameters())
      if (p.requires_grad()) use_order.push_back(p);
  grads_ = std::make_unique<ModelGradients>(
      trainable, use_order, gradient_reduction(c),
      GradientGroups{parallel_.group(Group::kDpCp), parallel_.group(Group::kEdp), parallel_.group(Group::kEp),
                     parallel_.group(Group::kPp), parallel_.group(Group::kTp), parallel_.world_rank()},
      TensorParallelParameters{
          [](const std::string& name) { return tensor_parallel_split(name) != TensorParallelSplit::kWhole; },
          [&c](const std::string& name) {
            return tensor_parallel_partial_gradient(name, c.model, c.parallel.sequence_parallel);
          }});
  optimizer_ = std::make_unique<AdamW>(
      grads_->shards(), AdamWOptions{c.optim.beta1, c.optim.beta2, c.optim.eps, c.optim.weight_decay});
  if (c.model.n_routed_experts > 0) {
    auto balancing = std::make_unique<MoeBalancing>(stage_.model->moe_layers(), parallel_.group(Group::kDpCp),
                                                    parallel_.group(Group::kCp).size(), parallel_.group(Group::kTp),
                                                    c.model, c.loop.grad_accum, device);
    balancing_ = balancing.get();
    post_step_hooks_.push_back(std::move(balancing));
  }
  schedule_ = {c.optim.lr, c.optim.min_lr, c.optim.warmup_steps, c.optim.decay_steps};
  plan_ = run_plan(c, parallel_, placement_);
  state_ = std::make_unique<TrainState>(TrainStateParts{&c, config_text_, &train_data_, stage_.layers_per_virtual_stage(),
                                                        params_, stage_.first_expert(c.model),
                                                        tensor_parallel_placement(parallel_), optimizer_.get(),
                                                        grads_.get(), guards_.loss_scaler()},
                                        parallel_);
  state_->restore(resume, weights);
  guards_.continue_after(state_->start_step());
  const LoaderOptions loader_options = rank_loader_options(c, parallel_, device);
  if (stage_.executor->needs_batches()) {
    LoaderOptions training = loader_options;  // (evaluation keeps the full batch)
    const LoopConfig& loop = config_.loop;
    if (loop.rampup.on())
      training.global_batch_after = [loop](uint64_t consumed) {
        return static_cast<uint64_t>(loop.global_batch_after(static_cast<int64_t>(consumed)));
      };
    loader_ = std::make_unique<DataLoader>(train_data_, training, static_cast<uint64_t>(state_->consumed_samples()));
  }
  validator_ = std::make_unique<Validator>(c, valid, *stage_.executor, loader_options, parallel_, device);
}

void Trainer::open_run_directory() {
  report_ = std::make_unique<StepReport>(
      StepReportSettings{state_->start_step(), config_.loop.steps, config_.log.interval, config_.loop.seq_len,
                         plan_.flops_per_token, plan_.peak_flops, placement_.device, state_->consumed_samples(),
                         config_.loop.rampup.on()},
      parallel_);
  if (parallel_.group(Group::kPp).size() > 1)
    report_->add_field_source(pipeline_bubble_field(*stage_.executor, parallel_));
  if (balancing_) report_->add_field_source(expert_balance_field(*balancing_));
  if (stage_.context_parallel)
    report_->add_field_source(context_parallel_ring_field(*stage_.context_parallel, parallel_, state_->start_step()));
  if (stage_.expert_exchange)
    report_->add_field_source(
        expert_exchange_field(*stage_.expert_exchange, *stage_.executor, parallel_, state_->start_step()));
  Communicator& replicas = parallel_.group(Group::kDpCp);
  if (replicas.size() > 1)  // times by host clocks: MPI's; NCCL's run on their own stream
    report_->add_field_source(
        data_parallel_comm_field(*grads_, parallel_, /*host_clocks=*/replicas.backend() == Backend::kMpi));
  report_->add_field_source(guards_.loss_scale_fields());
  report_->add_sink(std::make_unique<ConsoleSink>(state_->start_step(), config_.loop.steps));
  // A run already at train.steps (a requeued job that had finished, say) trains nothing: its run
  // directory keeps the configuration and logs of the run that did.
  if (parallel_.world_rank() != 0 || state_->start_step() >= config_.loop.steps) return;
  for (auto& sink : open_run_files(config_.run.dir, config_text_, state_->start_step()))
    report_->add_sink(std::move(sink));
}

StepResult Trainer::train_step(int64_t step) {
  // The step's batch: the configured one, or a batch-size ramp-up's for the samples so far.
  const int64_t consumed = state_->consumed_samples();
  const int64_t global_batch = config_.loop.global_batch_after(consumed);
  const int64_t micro_batches = config_.loop.grad_accum_after(consumed);
  stage_.executor->set_microbatches(static_cast<int>(micro_batches));
  grads_->set_microbatches(micro_batches);
  if (balancing_) balancing_->set_micro_batches(micro_batches);
  grads_->zero();
  // Every micro-batch has the same number of tokens, so the mean of the micro-batch means is
  // the mean over the global batch whatever grad_accum, dp and pp are.
  const DynamicLossScaler* scaler = guards_.loss_scaler();
  const std::vector<torch::Tensor> losses = stage_.executor->train_step(
      loader_ ? step_batches(*loader_, micro_batches, placement_.device) : PipelineExecutor::BatchSource(),
      static_cast<double>(micro_batches), guards_.backward_scale(step));
  grads_->reduce();
  torch::Tensor norm = grads_->global_norm();
  const torch::Tensor skipped = guards_.record_step(norm);
  // fp16: the gradients still carry the loss scale; the optimizer divides it out with clipping's.
  // (No divisor at all without either: the fused kernel would write every gradient back.)
  if (scaler) norm = norm / scaler->scale();
  torch::Tensor divisor;
  if (config_.optim.grad_clip > 0) divisor = clip_divisor(norm, config_.optim.grad_clip);
  if (scaler) divisor = divisor.defined() ? divisor * scaler->scale() : scaler->scale();
  state_->add_consumed_samples(global_batch);
  // The schedule counts steps, or tokens in steps of the full batch (optim.schedule_unit).
  const double lr = schedule_.at(config_.optim.schedule_unit == ScheduleUnit::kTokens
                                     ? static_cast<double>(state_->consumed_samples()) /
                                           static_cast<double>(config_.loop.global_batch)
                                     : static_cast<double>(step));
  optimizer_->step(lr, grads_->shard_grads(), skipped, divisor);
  grads_->gather_parameters();  // ZeRO-1: every rank's updated shard to every rank
  if (guards_.loss_scaler()) guards_.loss_scaler()->update(skipped);
  StepResult result{{}, norm, global_batch, lr};
  const std::vector<std::string> names = stage_.model->loss_names();
  for (size_t i = 0; i < names.size(); ++i) result.values.emplace_back(names[i], losses[i]);
  for (const auto& hook : post_step_hooks_) {
    hook->after_step(skipped);
    for (auto& value : hook->step_values()) result.values.push_back(std::move(value));
  }
  return result;
}

StepResult Trainer::train_step_checked(int64_t step) {
  const bool forbid_host_sync = config_.debug.forbid_host_sync && placement_.device.is_cuda();
  try {
    // Without host synchronisation the host queues the next step's kernels while the GPU runs
    // this one's; the log step is where it waits.
    accel::HostSyncForbidden no_waiting(forbid_host_sync);
    step_memory_.begin_step();
    StepResult result = train_step(step);
    step_memory_.end_step();
    return result;
  } catch (const c10::Error& e) {
    // LibTorch's message says only that an operation synchronised; its backtrace says which.
    const bool waited = std::string(e.what()).find("synchronizing CUDA operation") != std::string::npos;
    if (!forbid_host_sync || !waited) throw;
    throw Error(ExitCode::kInternal, "debug.forbid_host_sync: step " + std::to_string(step) +
                                         " made the host wait for the GPU: " + e.what());
  }
}

void Trainer::save_checkpoint(int64_t step) {
  guards_.check_steps(step);  // a non-finite step never reaches a checkpoint
  state_->save(step);
  guards_.inject_fault_in_save(step);
}

TrainResult Trainer::run() {
  try {
    return run_steps();
  } catch (const Error& e) {
    // Every rank stops on a numerical error at the same point, since the guards decide from
    // values reduced over all ranks. The save in flight began from a step checked finite: it
    // completes, so that a resume loses none of the steps before it.
    if (e.code() != ExitCode::kNumerical) throw;
    complete_save_in_flight();
    throw AgreedError(e);
  }
}

void Trainer::complete_save_in_flight() {
  try {
    state_->finish();
  } catch (const std::exception& failed) {
    // This rank's write failed; the error that stops the run stays the numerical one.
    log::error(failed.what());
  }
  // Rank 0 renames the file and moves `latest` after the others are done with the save: they wait
  // for it here, since the error then ends the job (MPI_Abort) wherever rank 0 is.
  parallel_.world().barrier();
}

TrainResult Trainer::run_steps() {
  const int64_t steps = config_.loop.steps;
  log_run_plan(config_, plan_, parallel_, placement_, stage_, *optimizer_, grads_->replicated().sharded(), train_data_);
  TrainResult result;
  if (state_->start_step() >= steps) {
    // A requeued job whose run had already finished: the run directory stays as it was.
    log::info("the checkpoint is at step ", state_->start_step(), " of train.steps = ", steps, ": nothing to do");
    result.steps = state_->start_step();
    return result;
  }
  const Clock::time_point start = Clock::now();
  report_->start();
  ProgressLine progress(state_->start_step(), steps);
  for (int64_t step = state_->start_step() + 1; step <= steps; ++step) {
    guards_.inject_fault(step);
    profiler_.before_step(step);
    const StepResult tensors = train_step_checked(step);
    profiler_.after_step(step);
    report_->add(tensors);
    progress.step_done(step, static_cast<double>(tensors.samples * config_.loop.seq_len));
    if (report_->due(step)) {
      guards_.check_logged_loss(step, report_->measure(step, tensors));
      report_->write();
    }
    if (validator_->due(step))
      report_->untimed(step, [&] {
        result.final_eval_loss = validator_->evaluate();
        report_->write_evaluation(step, result.final_eval_loss);
      });
    // The step boundary: a finished background save completes; a signal stops the run here.
    state_->poll();
    if (step < steps && guards_.stop_requested_anywhere()) {
      // Slurm's warning before a time limit or preemption: a checkpoint, then "requeue me".
      save_checkpoint(step);
      state_->finish();
      log::info("stopped by ", signals::stop_requested() ? signals::requested_by() : "a signal to another rank",
                " after step ", step, ": checkpoint written; resubmit the job to continue (exit code 75)");
      result.requeue = true;
      result.steps = step;
      result.final_loss = report_->final_loss();
      return result;
    }
    if (state_->save_due(step)) report_->untimed(step, [&] { save_checkpoint(step); });
    report_->finish_step(step);
  }
  return finish(result, start);
}

TrainResult Trainer::finish(TrainResult result, Clock::time_point start) {
  state_->finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();  // the steps, not the end
  const RunPlan& plan = plan_;
  result.steps = config_.loop.steps;
  result.start_step = state_->start_step();
  result.consumed_samples = state_->consumed_samples();
  result.final_loss = report_->final_loss();
  result.tokens_per_s = report_->tokens_per_s();
  result.mfu = plan.peak_flops > 0 ? plan.flops_per_token * result.tokens_per_s / plan.peak_flops : 0.0;
  result.peak_memory_bytes = accel::peak_allocated_bytes(placement_.device);
  // The largest rank's, as `model info` plans for the stage that holds the most.
  torch::Tensor peaks = torch::tensor({static_cast<double>(step_memory_.activation_bytes()),
                                       static_cast<double>(step_memory_.kept_bytes())},
                                      torch::kFloat64);
  parallel_.world().all_reduce(peaks, ReduceOp::kMax);
  result.peak_activation_bytes = static_cast<int64_t>(peaks[0].item<double>());
  result.step_kept_bytes = static_cast<int64_t>(peaks[1].item<double>());
  result.rerun_seconds = stage_.rerun_clock->seconds();
  if (stage_.context_parallel) result.ring_bytes = stage_.context_parallel->bytes_passed();
  result.param_digest = state_->finish_model(config_.loop.steps);
  write_run_summary(config_, parallel_, placement_, *optimizer_, result, validator_->enabled(), seconds);
  if (parallel_.world_rank() == 0)  // (the rank that wrote the summary)
    result.run_files = run_files_text(config_.run.dir, config_.ckpt.save_final);
  return result;
}

// The memory this rank shares with the others of its node: its GPU (placement gives local rank r
// GPU r % gpus), or the host's.
void require_state_fits_here(const Job& job) {
  const DevicePlacement& place = job.placement;
  const MemoryPlan plan = plan_memory(job.config, fused_operations(job.config));
  if (!place.device.is_cuda()) {
    require_state_fits(plan, place.local_size, accel::host_available_bytes(), "this host's available memory");
    return;
  }
  const int gpus = accel::device_count(), index = place.device.index();
  const int sharing = place.local_size / gpus + (index < place.local_size % gpus ? 1 : 0);
  require_state_fits(plan, sharing, accel::device_total_memory(index),
                     "GPU " + std::to_string(index) + " (" + place.name + ")");
}

}  // namespace

TrainResult run_training(Options options) {
  signals::install();  // (again: MPI's start-up may have installed handlers of its own)
  // A log that nobody reads (mpirun stops forwarding once signalled) must not stop training or
  // the checkpoint a stop signal asks for.
  log::write_in_background();
  Job job = start_job([&](int world_size, int world_rank) {
    TrainConfig config = read_train_config(options, world_size);
    log::configure(world_rank, world_size, config.log.all_ranks);
    // Before the communicators: a set-up that fails comes after the configuration it failed with.
    const ParallelConfig& p = config.parallel;
    log::info("dstrain ", DSTRAIN_VERSION, ": ", world_size, " rank(s), dp ", p.dp, " × pp ", p.pp,
              p.ep > 1 ? " (experts split over ep " + std::to_string(p.ep) + ")" : "", "\neffective configuration:\n",
              options.to_ini());
    return config;
  }, startup_timeout_s(options.raw("comm.timeout_s")));
  const std::string config_text = options.to_ini();
  // A start that fails removes the directories it made (a mistyped corpus leaves no run behind).
  std::vector<std::string> made_directories;
  std::unique_ptr<Trainer> trainer;
  try {
    agreed_phase(job.world_rank, [&] { require_state_fits_here(job); });
    const auto [resume, weights] = choose_start(job, made_directories);
    agreed_phase(job.world_rank, [&] { trainer = std::make_unique<Trainer>(job, config_text, resume, weights); });
    agreed_phase(job.world_rank, [&] { trainer->open_run_directory(); });
  } catch (...) {
    files::remove_empty_directories(made_directories);
    throw;
  }
  return run_or_abort(job, [&] { return trainer->run(); });
}

}  // namespace dstrain
