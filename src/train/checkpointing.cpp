#include "dstrain/train/checkpointing.h"

#include <algorithm>
#include <map>

#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

}  // namespace

CheckpointContents checkpoint_contents(const NamedTensors& params, const AdamW& optimizer, bool sharded) {
  CheckpointContents contents;
  for (const auto& [name, param] : params) contents.replicated.emplace_back("model/" + name, param);
  for (const AdamW::State& s : optimizer.states()) {
    std::vector<std::pair<std::string, torch::Tensor>> state;
    if (!s.master.is_same(s.param)) state.emplace_back("optim/" + s.name + "/master", s.master);
    state.emplace_back("optim/" + s.name + "/exp_avg", s.exp_avg);
    state.emplace_back("optim/" + s.name + "/exp_avg_sq", s.exp_avg_sq);
    for (auto& [name, tensor] : state) {
      if (sharded)
        contents.owned.push_back({name, tensor.reshape({-1}), s.full_shape, s.offset});
      else
        contents.replicated.emplace_back(name, tensor);
    }
  }
  return contents;
}

namespace {

// The options that give `global_batch` on this run's layout: the global batch, and a smaller
// micro-batch where this one does not divide its share of each data-parallel rank.
std::string global_batch_arguments(uint64_t global_batch, const std::map<std::string, std::string>& config) {
  std::string arguments = "--train.global_batch " + std::to_string(global_batch);
  const auto micro_text = config.find("train.micro_batch"), dp_text = config.find("parallel.dp");
  if (micro_text == config.end() || dp_text == config.end()) return arguments;
  const uint64_t micro = std::stoull(micro_text->second), dp = std::stoull(dp_text->second);
  if (micro == 0 || dp == 0 || global_batch % (micro * dp) == 0) return arguments;
  if (global_batch % dp != 0)
    return arguments + " on a number of data-parallel ranks that divides it (parallel.dp = " + std::to_string(dp) +
           " does not)";
  uint64_t fitting = micro;
  while ((global_batch / dp) % fitting != 0) --fitting;
  return arguments + " --train.micro_batch " + std::to_string(fitting);
}

}  // namespace

void check_resumable(const CheckpointReader& reader, const ResumeExpectations& expected) {
  const CheckpointState& s = reader.state();
  const std::string& path = reader.path();
  const auto& datasets = reader.datasets();
  if (std::none_of(datasets.begin(), datasets.end(),
                   [](const CheckpointReader::DatasetInfo& d) { return d.name.compare(0, 6, "optim/") == 0; }))
    throw Error(kCode, path + ": model weights without optimizer state (an import, or a run's final_model.h5): a run "
                       "cannot continue it; start one from its weights with ckpt.load_weights = " + path);
  const std::string other_model = model_shape_difference(s.model_shape, expected.model_shape);
  if (!other_model.empty()) throw Error(kCode, path + ": a checkpoint of another model: " + other_model);
  if (s.corpus_checksum != expected.corpus_fingerprint)
    throw Error(kCode, "data.train = " + expected.corpus_path + ": not the corpus " + path + " trained on (" +
                           s.corpus_path + ", fingerprint " + s.corpus_checksum + "; this one's is " +
                           expected.corpus_fingerprint + "); resume with that corpus, or set ckpt.resume = none");
  // Settings of the checkpoint's configuration that a resumed run should keep (checkpoints
  // written before a setting existed do not have it: nothing to compare).
  const std::map<std::string, std::string> theirs = checkpoint_config_values(s.config),
                                           ours = checkpoint_config_values(expected.config);
  if (s.global_batch != expected.global_batch)
    throw config_error("train.global_batch", std::to_string(expected.global_batch),
                       path + " was trained with " + std::to_string(s.global_batch) + " sequences per step; resume with " +
                           global_batch_arguments(s.global_batch, ours) + " (the data order depends on it)");
  if (s.seq_len != expected.seq_len)
    throw config_error("train.seq_len", std::to_string(expected.seq_len),
                       path + " was trained with " + std::to_string(s.seq_len) + "; resume with --train.seq_len " +
                           std::to_string(s.seq_len));
  auto changed = [&](const std::string& key) {
    const auto there = theirs.find(key), here = ours.find(key);
    return there != theirs.end() && here != ours.end() && there->second != here->second;
  };
  if (changed("run.seed"))
    throw config_error("run.seed", ours.at("run.seed"),
                       path + " was trained with seed " + theirs.at("run.seed") + "; resume with --run.seed " +
                           theirs.at("run.seed") + " (the data order depends on it)");
  std::string schedule_changes;
  for (const char* key : {"optim.lr", "optim.min_lr", "optim.warmup_steps", "optim.decay_steps"})
    if (changed(key))
      schedule_changes += std::string(schedule_changes.empty() ? "" : "; ") + key + " = " + theirs.at(key) +
                          " there, " + ours.at(key) + " here";
  if (!schedule_changes.empty())
    log::warning("the learning-rate schedule differs from the one ", path, " was trained with (", schedule_changes,
                 "): the run continues on its own schedule from step ", s.step + 1,
                 " (optim.decay_steps follows train.steps unless given)");
}

void load_checkpoint(const CheckpointReader& reader, AdamW& optimizer, const NamedTensors& params) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    if (param.requires_grad()) continue;  // the optimizer's, below
    const CheckpointReader::DatasetInfo* info = reader.find("model/" + name);
    if (!info) throw Error(kCode, reader.path() + ": /model/" + name + " is missing (a checkpoint of another model?)");
    if (info->shape != param.sizes().vec())
      throw Error(kCode, reader.path() + ": /model/" + name + " has another shape than this model's");
    param.copy_(reader.read("model/" + name));
  }
  for (AdamW::State& s : optimizer.states()) {
    // The fp32 master when the checkpoint has one (a bf16/fp16 run), else the parameter itself.
    const std::string master = "optim/" + s.name + "/master";
    for (const std::string& name : {"model/" + s.name, "optim/" + s.name + "/exp_avg", "optim/" + s.name + "/exp_avg_sq"}) {
      const CheckpointReader::DatasetInfo* info = reader.find(name);
      if (!info) throw Error(kCode, reader.path() + ": /" + name + " is missing (a checkpoint of another model?)");
      if (info->shape != s.full_shape)
        throw Error(kCode, reader.path() + ": /" + name + " has another shape than this model's " + s.name);
    }
    // This rank's part only (the pieces of the file that hold it, each checked).
    auto part = [&](const std::string& name) {
      return reader.read_range(name, s.offset, s.master.numel()).view(s.master.sizes());
    };
    s.master.copy_(part(reader.find(master) ? master : "model/" + s.name));
    s.exp_avg.copy_(part("optim/" + s.name + "/exp_avg"));
    s.exp_avg_sq.copy_(part("optim/" + s.name + "/exp_avg_sq"));
  }
  optimizer.load_masters();
  optimizer.set_step_count(static_cast<int64_t>(reader.state().optimizer_steps));
}

void load_weights(const CheckpointReader& reader, AdamW& optimizer, const NamedTensors& params) {
  torch::NoGradGuard no_grad;
  // The dataset to read `name` from: the fp32 master of a bf16/fp16 run is the more precise.
  auto source = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const std::string master = "optim/" + name + "/master", dataset = reader.find(master) ? master : "model/" + name;
    const CheckpointReader::DatasetInfo* info = reader.find(dataset);
    if (!info)
      throw Error(kCode, reader.path() + ": no dataset /model/" + name +
                             ": the weights of another model (compare `dstrain ckpt inspect`)");
    if (info->shape != shape) {
      std::string has, wants;
      for (int64_t d : info->shape) has += (has.empty() ? "" : ", ") + std::to_string(d);
      for (int64_t d : shape) wants += (wants.empty() ? "" : ", ") + std::to_string(d);
      throw Error(kCode, reader.path() + ": /" + dataset + " has shape [" + has + "]; this model's " + name + " has [" +
                             wants + "]");
    }
    return dataset;
  };
  for (const auto& [name, param] : params)
    if (!param.requires_grad()) param.copy_(reader.read(source(name, param.sizes().vec())));
  for (AdamW::State& s : optimizer.states())  // this rank's part only (ZeRO-1)
    s.master.copy_(reader.read_range(source(s.name, s.full_shape), s.offset, s.master.numel()).view(s.master.sizes()));
  optimizer.load_masters();
}

}  // namespace dstrain
