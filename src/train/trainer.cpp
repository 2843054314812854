#include "dstrain/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/data/corpus.h"
#include "dstrain/data/loader.h"
#include "dstrain/dist/mpi_check.h"
#include "dstrain/dist/parallel_context.h"
#include "dstrain/model/transformer.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/optim/gradients.h"
#include "dstrain/optim/lr_schedule.h"
#include "dstrain/train/metrics.h"
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

struct StepStats {
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0;
};

class Trainer {
 public:
  Trainer(const TrainConfig& config, const Options& effective, ParallelContext& parallel);
  TrainResult run();

 private:
  StepStats train_step(int64_t step);
  double evaluate();
  void log_step(int64_t step, const StepStats& stats, double mean_step_seconds);

  TrainConfig config_;
  ParallelContext& parallel_;
  bool is_reporting_rank_;
  std::shared_ptr<const CorpusReader> train_corpus_, valid_corpus_;
  CausalLM model_{nullptr};
  NamedTensors params_;
  std::unique_ptr<AdamW> optimizer_;
  LrSchedule schedule_;
  LoaderOptions loader_options_;
  std::unique_ptr<DataLoader> loader_;
  MetricsLog metrics_;
  std::string summary_path_;
};

Trainer::Trainer(const TrainConfig& c, const Options& effective, ParallelContext& parallel)
    : config_(c), parallel_(parallel), is_reporting_rank_(parallel.world_rank == 0) {
  torch::set_num_threads(c.loop.threads);
  train_corpus_ = std::make_shared<CorpusReader>(c.data.train);
  if (!c.data.valid.empty()) valid_corpus_ = std::make_shared<CorpusReader>(c.data.valid);
  for (const auto& corpus : {train_corpus_, valid_corpus_}) {
    if (corpus && corpus->info().vocab_size > static_cast<uint64_t>(c.model.vocab_size))
      throw config_error("model.vocab_size", std::to_string(c.model.vocab_size),
                         "smaller than the vocabulary of " + corpus->info().path + " (" +
                             std::to_string(corpus->info().vocab_size) + ", tokenizer " +
                             corpus->info().tokenizer + ")");
  }

  model_ = CausalLM(c.model, LayerSlice::whole(c.model));
  initialize_parameters(*model_, c.model, c.run.seed);
  params_ = sorted_parameters(*model_);
  optimizer_ = std::make_unique<AdamW>(
      params_, AdamWOptions{c.optim.beta1, c.optim.beta2, c.optim.eps, c.optim.weight_decay});
  schedule_ = {c.optim.lr, c.optim.min_lr, c.optim.warmup_steps, c.optim.decay_steps};

  loader_options_.seq_len = c.loop.seq_len;
  loader_options_.layout = {static_cast<uint64_t>(c.loop.micro_batch), static_cast<uint64_t>(c.loop.grad_accum),
                            static_cast<uint64_t>(parallel.grid.dp()), static_cast<uint64_t>(parallel.coord.dp)};
  loader_options_.seed = c.run.seed;
  loader_options_.model_vocab = c.model.vocab_size;
  loader_options_.prefetch_depth = c.data.prefetch;
  loader_ = std::make_unique<DataLoader>(train_corpus_, loader_options_, /*start_step=*/0);
  if (valid_corpus_) {
    uint64_t available = samples_in_corpus(valid_corpus_->info().n_tokens, c.loop.seq_len) /
                         static_cast<uint64_t>(c.loop.global_batch);
    if (available == 0)
      throw data_error(c.data.valid + ": too small for one global batch of " +
                       std::to_string(c.loop.global_batch) + " sequences of " +
                       std::to_string(c.loop.seq_len + 1) + " tokens");
    if (available < static_cast<uint64_t>(c.loop.eval_batches)) {
      log::warning("train.eval_batches = ", c.loop.eval_batches, ": ", c.data.valid, " holds only ",
                   available, " global batches; evaluating on those");
      config_.loop.eval_batches = static_cast<int64_t>(available);
    }
  }

  if (is_reporting_rank_) {
    std::filesystem::create_directories(c.run.dir);
    write_text_file(c.run.dir + "/config.ini", effective.to_ini());
    metrics_ = MetricsLog(c.run.dir + "/metrics.jsonl");
    summary_path_ = c.run.dir + "/summary.json";
  }
}

StepStats Trainer::train_step(int64_t step) {
  Clock::time_point start = Clock::now();
  StepStats stats;
  for (auto& [name, param] : params_) param.mutable_grad() = torch::Tensor();
  double local_loss = 0.0;
  for (int64_t micro = 0; micro < config_.loop.grad_accum; ++micro) {
    torch::Tensor batch = loader_->next();
    torch::Tensor inputs = batch.narrow(1, 0, config_.loop.seq_len);
    torch::Tensor targets = batch.narrow(1, 1, config_.loop.seq_len);
    // Every micro-batch has the same number of tokens, so the mean of the micro-batch means is
    // the mean over the global batch whatever grad_accum and dp are.
    torch::Tensor loss = lm_loss(model_(inputs), targets) / static_cast<double>(config_.loop.grad_accum);
    loss.backward();
    local_loss += loss.item<double>();
  }
  average_gradients(params_, *parallel_.dp_group);
  torch::Tensor loss_sum = torch::full({1}, local_loss, torch::kFloat64);
  parallel_.dp_group->all_reduce(loss_sum, ReduceOp::kAvg);
  stats.loss = loss_sum.item<double>();
  stats.grad_norm = global_grad_norm(params_, /*model_group=*/nullptr);
  if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm))
    throw Error(ExitCode::kNumerical, "step " + std::to_string(step) + ": non-finite loss (" +
                                          std::to_string(stats.loss) + ") or gradient norm (" +
                                          std::to_string(stats.grad_norm) +
                                          "); lower optim.lr or check the data");
  clip_gradients(params_, stats.grad_norm, config_.optim.grad_clip);
  stats.lr = schedule_.at(step);
  optimizer_->step(stats.lr);
  stats.seconds = seconds_since(start);
  return stats;
}

double Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  LoaderOptions options = loader_options_;
  options.shuffle = false;  // the same sequences every time, whatever the step
  DataLoader loader(valid_corpus_, options, /*start_step=*/0);
  double total = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; b < config_.loop.eval_batches; ++b) {
    for (int64_t micro = 0; micro < config_.loop.grad_accum; ++micro, ++count) {
      torch::Tensor batch = loader.next();
      total += lm_loss(model_(batch.narrow(1, 0, config_.loop.seq_len)),
                       batch.narrow(1, 1, config_.loop.seq_len))
                   .item<double>();
    }
  }
  torch::Tensor mean = torch::full({1}, total / static_cast<double>(count), torch::kFloat64);
  parallel_.dp_group->all_reduce(mean, ReduceOp::kAvg);
  return mean.item<double>();
}

void Trainer::log_step(int64_t step, const StepStats& stats, double mean_step_seconds) {
  const double tokens_per_s = static_cast<double>(config_.loop.global_batch * config_.loop.seq_len) / stats.seconds;
  const int64_t steps = config_.loop.steps;
  char line[256];
  std::snprintf(line, sizeof line,
                "step %*lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | %.3f s/step | ETA %s",
                static_cast<int>(std::to_string(steps).size()), static_cast<long long>(step),
                static_cast<long long>(steps), stats.loss, stats.lr, stats.grad_norm,
                with_commas(tokens_per_s).c_str(), stats.seconds,
                format_duration(mean_step_seconds * static_cast<double>(steps - step)).c_str());
  log::info(line);
  metrics_.write({{"step", step},
                  {"loss", stats.loss},
                  {"lr", stats.lr},
                  {"grad_norm", stats.grad_norm},
                  {"tokens_per_s", tokens_per_s},
                  {"step_time_s", stats.seconds},
                  {"consumed_samples", loader_->consumed_samples()},
                  {"tokens", loader_->consumed_samples() * static_cast<uint64_t>(config_.loop.seq_len)}});
}

TrainResult Trainer::run() {
  const int64_t steps = config_.loop.steps;
  log::info("training ", steps, " steps: global batch ", config_.loop.global_batch, " × ",
            config_.loop.seq_len, " tokens (micro_batch ", config_.loop.micro_batch, " × grad_accum ",
            config_.loop.grad_accum, " × dp ", parallel_.grid.dp(), "), ",
            with_commas(static_cast<double>(train_corpus_->info().n_tokens)), " tokens in ",
            config_.data.train);
  TrainResult result;
  Clock::time_point start = Clock::now();
  double timed_seconds = 0.0;  // steps after the first, which pays for warm-up
  for (int64_t step = 1; step <= steps; ++step) {
    StepStats stats = train_step(step);
    if (step > 1) timed_seconds += stats.seconds;
    double mean_step = step > 1 ? timed_seconds / static_cast<double>(step - 1) : stats.seconds;
    if (step % config_.log.interval == 0 || step == steps) log_step(step, stats, mean_step);
    result.final_loss = stats.loss;
    bool eval_due = config_.loop.eval_interval > 0 && step % config_.loop.eval_interval == 0;
    if (valid_corpus_ && (eval_due || step == steps)) {
      result.final_eval_loss = evaluate();
      log::info("eval at step ", step, " | loss ", result.final_eval_loss, " | perplexity ",
                std::exp(result.final_eval_loss));
      metrics_.write({{"step", step}, {"eval_loss", result.final_eval_loss},
                      {"eval_ppl", std::exp(result.final_eval_loss)}});
    }
  }
  const double seconds = seconds_since(start);
  result.steps = steps;
  result.param_digest = parameter_digest(params_);
  const uint64_t tokens = loader_->consumed_samples() * static_cast<uint64_t>(config_.loop.seq_len);

  log::info("done: ", steps, " steps in ", format_duration(seconds), ", ",
            with_commas(static_cast<double>(tokens)), " tokens (",
            with_commas(static_cast<double>(tokens) / seconds), " tok/s); final loss ",
            result.final_loss,
            valid_corpus_ ? ", eval loss " + std::to_string(result.final_eval_loss) : std::string());
  if (is_reporting_rank_) {
    nlohmann::json summary = {{"steps", steps},
                              {"tokens", tokens},
                              {"seconds", seconds},
                              {"final_loss", result.final_loss},
                              {"param_digest", result.param_digest},
                              {"layout", {{"dp", parallel_.grid.dp()}, {"pp", parallel_.grid.pp()}}}};
    if (valid_corpus_) summary["final_eval_loss"] = result.final_eval_loss;
    write_text_file(summary_path_, summary.dump(2) + "\n");
    log::info("metrics: ", metrics_.path(), "  config: ", config_.run.dir, "/config.ini  summary: ",
              summary_path_);
  }
  return result;
}

}  // namespace

TrainResult run_training(Options options) {
  int world_size = 1, world_rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));

  // Set-up: any rank may fail on its own (a file it cannot read); all agree before going on.
  std::optional<Error> failure;
  std::optional<ParallelContext> parallel;
  std::unique_ptr<Trainer> trainer;
  try {
    TrainConfig config = read_train_config(options, world_size);
    log::configure(world_rank, config.log.all_ranks);
    log::info("dstrain ", DSTRAIN_VERSION, ": ", world_size, " rank(s), dp ", config.parallel.dp, " × pp ",
              config.parallel.pp, "\neffective configuration:\n", options.to_ini());
    parallel.emplace(ParallelContext::create(RankGrid(world_size, config.parallel.dp, config.parallel.pp,
                                                      config.parallel.order)));
    trainer = std::make_unique<Trainer>(config, options, *parallel);
  } catch (const Error& e) {
    failure = e;
  } catch (const std::exception& e) {
    failure = Error(ExitCode::kInternal, e.what());
  }
  FailureAgreement agreement = agree_on_failure(failure ? static_cast<int>(failure->code()) : 0);
  if (agreement.exit_code != 0) {
    if (agreement.reporter == world_rank) throw *failure;
    throw Error(static_cast<ExitCode>(agreement.exit_code), "");  // reported by another rank
  }

  // Training: an error now is this rank's alone and the others are inside collectives; the
  // rank says what happened and ends the job.
  try {
    return trainer->run();
  } catch (const std::exception& e) {
    const Error* error = dynamic_cast<const Error*>(&e);
    ExitCode code = error ? error->code() : ExitCode::kInternal;
    if (world_size == 1) throw Error(code, e.what());
    log::error(e.what());
    MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
    throw;
  }
}

}  // namespace dstrain
