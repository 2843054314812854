// The state of a training run in one place: what a checkpoint captures of it and restores
// (ckpt.resume), a fresh start from another checkpoint's weights (ckpt.load_weights), the saves
// every ckpt.interval steps, and the final model (ckpt.save_final). The file format itself is
// ckpt's.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/ckpt/checkpoint_writer.h"
#include "dstrain/ckpt/training_checkpoint.h"
#include "dstrain/ckpt/format.h"
#include "dstrain/data/mixture.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/train/model_gradients.h"
#include "dstrain/optim/loss_scaler.h"
#include "dstrain/train/job.h"
#include "dstrain/train/train_config.h"

namespace dstrain {

// Which checkpoint to continue from (ckpt.resume: "auto" takes ckpt.dir's latest), and, when
// there is none, which checkpoint's weights to start from (ckpt.load_weights): {resume, weights},
// "" for none, the same on every rank. Decided by rank 0 alone, so that ranks that see a shared
// file system at different moments cannot disagree. It makes ckpt.dir now, so that an unusable
// one is found at the start, not at the first save; `made` collects the directories it made.
std::pair<std::string, std::string> choose_start(const Job& job, std::vector<std::string>& made);

// What the state is made of; every member outlives the TrainState.
struct TrainStateParts {
  const TrainConfig* config = nullptr;
  std::string config_text;  // the effective configuration, INI
  const Mixture* train_data = nullptr;
  std::string layers_per_virtual_stage;  // "2,2"
  NamedTensors params;                   // every parameter of this rank's chunks, by checkpoint name
  int64_t first_expert = 0;              // the global number of the first routed expert held
  TensorParallelPlacement placement;     // where the tensors lie in the whole ones, who writes which
  AdamW* optimizer = nullptr;
  ModelGradients* grads = nullptr;
  DynamicLossScaler* loss_scaler = nullptr;  // fp16 only
};

class TrainState {
 public:
  TrainState(TrainStateParts parts, ParallelContext& parallel);

  // `resume`: the checkpoint to continue from ("": start afresh), the same on every rank;
  // `weights`: when starting afresh, the checkpoint whose model weights to start from ("": none).
  // Throws Error naming what does not fit.
  void restore(const std::string& resume, const std::string& weights);
  int64_t start_step() const { return start_step_; }
  // Samples the steps so far have consumed: the data position (from the checkpoint on resume).
  int64_t consumed_samples() const { return consumed_samples_; }
  void add_consumed_samples(int64_t samples) { consumed_samples_ += samples; }

  bool save_due(int64_t step) const;  // every ckpt.interval steps, and after the last
  // Starts writing a checkpoint of the state after `step` (training goes on meanwhile).
  void save(int64_t step);
  // At a step boundary: a finished background save completes (visible, `latest` moved).
  void poll() { checkpoints_->poll(); }
  void finish() { checkpoints_->finish(); }

  // After the last step (collective): the whole model's digest on the reporting rank (FNV-1a
  // over every parameter's name and bytes, "" elsewhere), and ckpt.save_final's file there.
  std::string finish_model(int64_t step);

 private:
  void resume_from(const std::string& path);
  void start_from_weights(const std::string& path);
  // What a checkpoint of the state after `step` records besides tensors (this rank's view).
  CheckpointState capture(int64_t step) const;
  // The whole model after `step`, fp32, as a checkpoint of the model alone in one file, like an
  // import: eval, generate, export-hf and ckpt.load_weights take it.
  void write_final_model(int64_t step, const NamedTensors& model) const;

  TrainStateParts parts_;
  ParallelContext& parallel_;
  std::string corpus_fingerprint_;
  std::unique_ptr<CheckpointWriter> checkpoints_;
  int64_t start_step_ = 0;  // the step a resumed run continues after
  int64_t consumed_samples_ = 0;
};

}  // namespace dstrain
