// The training loop's side of its checkpoints: AdamW's state handed to ckpt as views, and the
// checks that decide whether a run may continue from a checkpoint.
#include "dstrain/train/checkpointing.h"

#include <map>
#include <string>
#include <vector>

#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/ckpt/expert_layout.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/model/moe.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

// The optimizer's state as the checkpoint sees it: the same tensors, by name and place, the
// routed experts' stacked states as a view per expert (numbered from `first_expert`).
std::vector<OptimizerStateView> state_views(const AdamW& optimizer, int64_t first_expert) {
  std::vector<OptimizerStateView> views;
  for (const AdamW::State& s : optimizer.states())
    views.push_back({s.name, s.param, s.master, s.exp_avg, s.exp_avg_sq, s.full_shape, s.offset});
  return per_expert_state_views(views, first_expert);
}

// The parameters and optimizer state, experts written by their first holder.
CheckpointContents model_and_optimizer_contents(const NamedTensors& params, const AdamW& optimizer,
                                                ModelGradients& grads, int64_t first_expert,
                                                const TensorParallelPlacement& placement) {
  const std::vector<OptimizerStateView> states = state_views(optimizer, first_expert);
  if (!grads.experts()) return checkpoint_contents(params, states, grads.replicated().sharded(), placement);
  NamedTensors replicated_params, expert_params;
  for (const auto& named : params) (is_routed_expert_parameter(named.first) ? expert_params : replicated_params).push_back(named);
  std::vector<OptimizerStateView> replicated_states, expert_states;
  for (const OptimizerStateView& view : states)
    (is_routed_expert_parameter(view.name) ? expert_states : replicated_states).push_back(view);
  CheckpointContents contents =
      checkpoint_contents(replicated_params, replicated_states, grads.replicated().sharded(), placement);
  const CheckpointContents experts = checkpoint_contents(expert_params, expert_states, grads.experts()->sharded());
  // What the experts' holders each have whole is written once; the shards by their owners.
  if (grads.writes_experts())
    for (const auto& [name, tensor] : experts.replicated) contents.owned.push_back({name, tensor, tensor.sizes().vec(), 0});
  contents.owned.insert(contents.owned.end(), experts.owned.begin(), experts.owned.end());
  return contents;
}

// The model settings besides model_shape's that fix which tensors a model has, or their shapes
// (a run that reads another's checkpoint would drop tensors it has, an MTP module or the balancing
// bias, or fail on a shape); then those that change what the same tensors compute (position
// encoding, norms, routing), which may be meant (a longer context's RoPE scaling, say). MLA's and
// MoE's settings count only for a model that has them (`model`: the run's).
struct ModelKeys {
  std::vector<std::string> tensors, function;
};
ModelKeys model_keys(const ModelConfig& model) {
  ModelKeys keys;
  keys.tensors = {"model.kv_lora_rank", "model.n_routed_experts", "model.num_nextn_predict_layers"};
  keys.function = {"model.rope_theta", "model.rope_interleave", "model.rope_scaling_factor",
                   "model.rope_mscale_all_dim", "model.rope_mscale", "model.rope_original_max_seq_len",
                   "model.rope_beta_fast", "model.rope_beta_slow", "model.rms_norm_eps"};
  if (model.is_mla())
    keys.tensors.insert(keys.tensors.end(), {"model.q_lora_rank", "model.qk_nope_head_dim", "model.qk_rope_head_dim",
                                             "model.v_head_dim"});
  if (model.n_routed_experts > 0) {
    keys.tensors.insert(keys.tensors.end(), {"model.n_shared_experts", "model.moe_intermediate_size",
                                             "model.first_k_dense_replace", "model.moe_layer_freq", "model.topk_method"});
    keys.function.insert(keys.function.end(), {"model.num_experts_per_tok", "model.scoring_func", "model.n_group",
                                               "model.topk_group", "model.norm_topk_prob", "model.routed_scaling_factor"});
  }
  return keys;
}

// "KEY = A there, B here; ..." for the `keys` whose values differ between a checkpoint's
// configuration and the run's; a key either lacks (a checkpoint older than the setting) is not
// compared.
std::string differences(const std::map<std::string, std::string>& theirs, const std::map<std::string, std::string>& ours,
                        const std::vector<std::string>& keys) {
  std::string text;
  for (const std::string& key : keys) {
    const auto there = theirs.find(key), here = ours.find(key);
    if (there == theirs.end() || here == ours.end() || there->second == here->second) continue;
    text += (text.empty() ? "" : "; ") + key + " = " + there->second + " there, " + here->second + " here";
  }
  return text;
}

}  // namespace

CheckpointContents checkpoint_contents(const NamedTensors& params, const AdamW& optimizer, ModelGradients& grads,
                                       int64_t first_expert, const TensorParallelPlacement& placement) {
  CheckpointContents contents = model_and_optimizer_contents(params, optimizer, grads, first_expert, placement);
  // Each rank's carried quantization error (8-bit gradients with error feedback), by itself.
  for (const auto& [name, tensor] : grads.error_feedback()) contents.owned.push_back({name, tensor, tensor.sizes().vec(), 0});
  return contents;
}

void restore_error_feedback(const CheckpointReader& reader, ModelGradients& grads, bool same_layout) {
  bool complete = true;
  for (auto& [name, carried] : grads.error_feedback()) {
    // (Buckets of another size, comm.bucket_mb changed say, carry errors of other gradients too.)
    const CheckpointReader::DatasetInfo* stored = same_layout ? reader.find(name) : nullptr;
    if (stored && stored->shape == carried.sizes().vec())
      carried.copy_(reader.read(name).to(carried.device()).view_as(carried));
    else
      complete = false;
  }
  if (!complete)
    log::info("comm.error_feedback: ", reader.path(), same_layout ? " has no carried quantization error for these gradient buckets"
                                                                   : " was written on another layout",
              "; the error carried over starts from zero");
}

void check_resumable(const CheckpointReader& reader, const ResumeExpectations& expected) {
  const CheckpointState& s = reader.state();
  const std::string& path = reader.path();
  if (!has_optimizer_state(reader))
    throw Error(kCode, path + ": model weights without optimizer state (an import, or a run's final_model.h5): a run "
                       "cannot continue it; start one from its weights with ckpt.load_weights = " + path);
  // Settings of the checkpoint's configuration that a resumed run should keep (checkpoints
  // written before a setting existed do not have it: nothing to compare).
  const std::map<std::string, std::string> theirs = checkpoint_config_values(s.config),
                                           ours = checkpoint_config_values(expected.config);
  std::string other_model = model_shape_difference(s.model_shape, expected.model_shape);
  const ModelKeys model = model_keys(expected.model);
  if (other_model.empty()) other_model = differences(theirs, ours, model.tensors);
  if (!other_model.empty()) throw Error(kCode, path + ": a checkpoint of another model: " + other_model);
  const std::string other_function = differences(theirs, ours, model.function);
  if (!other_function.empty())
    log::warning("the model computes otherwise than the one ", path, " was trained with (", other_function,
                 "): its weights are read as they are");
  if (s.corpus_checksum != expected.corpus_fingerprint)
    throw Error(kCode, "data.train = " + expected.corpus_path + ": not the corpus " + path + " trained on (" +
                           s.corpus_path + ", fingerprint " + s.corpus_checksum + "; this one's is " +
                           expected.corpus_fingerprint + "); resume with that corpus, or set ckpt.resume = none");
  // The data position is the number of samples consumed, so another global batch (a ramp-up's
  // next stage, say) continues from where the checkpoint's run was.
  if (s.global_batch != expected.global_batch)
    log::info("train.global_batch = ", expected.global_batch, " where ", path, " was trained with ", s.global_batch,
              ": the run continues from its data position, after ", s.consumed_samples, " samples");
  if (s.seq_len != expected.seq_len)
    throw config_error("train.seq_len", std::to_string(expected.seq_len),
                       path + " was trained with " + std::to_string(s.seq_len) + "; resume with --train.seq_len " +
                           std::to_string(s.seq_len));
  if (!differences(theirs, ours, {"run.seed"}).empty())
    throw config_error("run.seed", ours.at("run.seed"),
                       path + " was trained with seed " + theirs.at("run.seed") + "; resume with --run.seed " +
                           theirs.at("run.seed") + " (the data order depends on it)");
  const std::string schedule_changes =
      differences(theirs, ours, {"optim.lr", "optim.min_lr", "optim.warmup_steps", "optim.decay_steps"});
  if (!schedule_changes.empty() && s.step < expected.steps)
    log::warning("the learning-rate schedule differs from the one ", path, " was trained with (", schedule_changes,
                 "): the run continues on its own schedule from step ", s.step + 1,
                 " (optim.decay_steps follows train.steps unless given)");
}

void load_checkpoint(const CheckpointReader& reader, AdamW& optimizer, const NamedTensors& params,
                     int64_t first_expert, const TensorParallelPlacement& placement) {
  load_training_tensors(reader, state_views(optimizer, first_expert), params, placement);
  optimizer.load_masters();
  optimizer.set_step_count(static_cast<int64_t>(reader.state().optimizer_steps));
}

void load_weights(const CheckpointReader& reader, AdamW& optimizer, const NamedTensors& params,
                  int64_t first_expert, const TensorParallelPlacement& placement) {
  load_master_weights(reader, state_views(optimizer, first_expert), params, placement);
  optimizer.load_masters();
}

}  // namespace dstrain
