#include "dstrain/train/train_state.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/gather.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/parallel/agreed_phase.h"
#include "dstrain/train/checkpointing.h"

namespace dstrain {
namespace {

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

torch::Tensor default_generator_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

}  // namespace

std::pair<std::string, std::string> choose_start(const Job& job, std::vector<std::string>& made) {
  const TrainConfig& config = job.config;
  std::string resume, weights;
  agreed_phase(job.world_rank, [&] {
    if (job.world_rank != 0) return;
    std::string why;
    if (!files::make_directories(config.ckpt.dir, &why, &made)) {
      if (config.ckpt.dir_in_run_dir)
        throw config_error("run.dir", config.run.dir, "cannot create " + config.ckpt.dir + " (" + why + ")");
      throw config_error("ckpt.dir", config.ckpt.dir, "cannot create this directory (" + why + ")");
    }
    // Found now, not at the first save, after a whole interval of steps.
    if (!files::can_write_in(config.ckpt.dir, &why)) {
      if (config.ckpt.dir_in_run_dir)
        throw config_error("run.dir", config.run.dir, "cannot write in " + config.ckpt.dir + " (" + why + ")");
      throw config_error("ckpt.dir", config.ckpt.dir, "cannot write in this directory (" + why + ")");
    }
    resume = resolve_resume(config.ckpt.resume, config.ckpt.dir);
    if (resume.empty() && !config.ckpt.load_weights.empty())
      weights = resolve_checkpoint(config.ckpt.load_weights, "ckpt.load_weights");
  });
  return {job.parallel->world().broadcast_string(resume, 0), job.parallel->world().broadcast_string(weights, 0)};
}

TrainState::TrainState(TrainStateParts parts, ParallelContext& parallel)
    : parts_(std::move(parts)), parallel_(parallel), corpus_fingerprint_(parts_.train_data->fingerprint()) {
  const CkptConfig& c = parts_.config->ckpt;
  checkpoints_ = std::make_unique<CheckpointWriter>(c.dir, RetentionPolicy{c.keep_last, c.keep_every}, parallel.world(),
                                                    parallel.group(Group::kDpCp), parts_.config->comm.timeout_s);
}

void TrainState::restore(const std::string& resume, const std::string& weights) {
  if (!resume.empty()) {
    resume_from(resume);
    if (!parts_.config->ckpt.load_weights.empty())
      log::info("ckpt.load_weights = ", parts_.config->ckpt.load_weights,
                " left aside: the run continues from its own checkpoint");
  } else if (!weights.empty()) {
    start_from_weights(weights);
  }
}

void TrainState::resume_from(const std::string& path) {
  const TrainConfig& config = *parts_.config;
  CheckpointReader reader(path);
  const CheckpointState& state = reader.state();
  check_resumable(reader, {config.model, model_shape_text(config.model), config.data.train, corpus_fingerprint_,
                           static_cast<uint64_t>(config.loop.global_batch), static_cast<uint64_t>(config.loop.seq_len),
                           parts_.config_text, config.loop.steps});
  load_checkpoint(reader, *parts_.optimizer, parts_.params, parts_.first_expert, parts_.placement);
  parts_.grads->gather_parameters();  // ZeRO-1: each rank loaded its shard of the weights
  if (parts_.loss_scaler && state.loss_scale > 0)
    parts_.loss_scaler->restore(state.loss_scale, state.loss_scale_clean_steps, state.skipped_steps);
  // The generator states and carried quantization errors go back where they came from when the
  // layout is the same.
  const ParallelConfig theirs = checkpoint_layout(state.config);
  const bool same_layout = state.world_size == static_cast<uint64_t>(parallel_.grid().world()) &&
                           ParallelGrid(theirs).same_places(parallel_.grid());
  restore_error_feedback(reader, *parts_.grads, same_layout);
  if (same_layout) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle to the default
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.rng[parallel_.world_rank()].contiguous());
  }
  start_step_ = state.step;
  consumed_samples_ = static_cast<int64_t>(state.consumed_samples);
  log::info("resuming from ", path, ": after step ", state.step, ", ", state.consumed_samples,
            " samples consumed; written by ", theirs.tp > 1 ? "tp " + std::to_string(theirs.tp) + " × " : "", "dp ",
            state.dp, " × pp ", state.pp,
            theirs.ep > 1 ? " (experts over ep " + std::to_string(theirs.ep) + ")" : "", " (", state.schedule, ")",
            same_layout ? "" : ", continuing on this layout");
}

void TrainState::start_from_weights(const std::string& path) {
  CheckpointReader reader(path);
  load_weights(reader, *parts_.optimizer, parts_.params, parts_.first_expert, parts_.placement);
  parts_.grads->gather_parameters();  // ZeRO-1: each rank loaded its shard of the weights
  log::info("starting from the weights of ", path, " (its step ", reader.state().step,
            "): fresh optimizer state, step 0");
}

CheckpointState TrainState::capture(int64_t step) const {
  const TrainConfig& config = *parts_.config;
  CheckpointState state;
  state.step = step;
  state.consumed_samples = static_cast<uint64_t>(consumed_samples_);  // (`step` is the last step taken)
  state.tokens = state.consumed_samples * static_cast<uint64_t>(config.loop.seq_len);
  state.optimizer_steps = static_cast<uint64_t>(parts_.optimizer->step_count());
  if (parts_.loss_scaler) {
    state.loss_scale = parts_.loss_scaler->scale().item<double>();
    state.loss_scale_clean_steps = parts_.loss_scaler->clean_steps();
    state.skipped_steps = parts_.loss_scaler->skipped_steps().item<double>();
  }
  state.global_batch = static_cast<uint64_t>(config.loop.global_batch);
  state.seq_len = static_cast<uint64_t>(config.loop.seq_len);
  state.config = parts_.config_text;
  state.model_shape = model_shape_text(config.model);
  state.corpus_path = config.data.train;
  state.corpus_checksum = corpus_fingerprint_;
  state.tokenizer = parts_.train_data->corpora.front()->info().tokenizer;  // a mixture's corpora share it
  state.world_size = static_cast<uint64_t>(parallel_.grid().world());
  state.dp = static_cast<uint64_t>(parallel_.grid().size(Group::kDp));
  state.pp = static_cast<uint64_t>(parallel_.grid().size(Group::kPp));
  state.virtual_stages = static_cast<uint64_t>(config.pipeline.virtual_stages);
  state.schedule = schedule_name(config.pipeline.schedule);
  state.stage_layers = parts_.layers_per_virtual_stage;
  return state;
}

bool TrainState::save_due(int64_t step) const {
  const int64_t interval = parts_.config->ckpt.interval;
  return interval > 0 && (step % interval == 0 || step == parts_.config->loop.steps);
}

void TrainState::save(int64_t step) {
  CheckpointContents contents =
      checkpoint_contents(parts_.params, *parts_.optimizer, *parts_.grads, parts_.first_expert, parts_.placement);
  const double blocked =
      checkpoints_->begin(step, contents.replicated, contents.owned, capture(step), default_generator_state());
  char text[96];
  std::snprintf(text, sizeof text, "checkpoint of step %lld: training blocked %.2f s; writing in the background",
                static_cast<long long>(step), blocked);
  log::info(text);
}

std::string TrainState::finish_model(int64_t step) {
  // The whole model on rank 0, whatever the layout: its digest, and the file if asked for.
  const NamedTensors model = gather_parameters(parts_.params, parallel_.world(), parallel_.grid());
  if (parallel_.world_rank() != 0) return "";
  if (parts_.config->ckpt.save_final) write_final_model(step, model);
  return parameter_digest(model);
}

void TrainState::write_final_model(int64_t step, const NamedTensors& model) const {
  CheckpointState state = capture(step);
  state.world_size = state.dp = state.pp = state.virtual_stages = 1;  // one file, one stage
  state.stage_layers = std::to_string(parts_.config->model.num_layers);
  state.rng = default_generator_state().reshape({1, -1});
  const std::map<std::string, torch::Tensor> by_name(model.begin(), model.end());
  std::vector<std::string> names;
  for (const auto& [name, tensor] : model) names.push_back(name);
  write_model_checkpoint(parts_.config->run.dir + "/final_model.h5", names,
                         [&](const std::string& name) { return by_name.at(name).to(torch::kFloat32); }, state);
}

}  // namespace dstrain
