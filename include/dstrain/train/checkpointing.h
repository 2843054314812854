// A training run's checkpoints as the loop sees them: its AdamW state saved and loaded through
// ckpt (training_checkpoint.h, which alone knows the datasets' names), and the checks that a
// checkpoint fits the run that wants to continue from it (the layout may differ; the model, the
// corpus and the batch may not).
#pragma once

#include <string>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/model_shape.h"  // model_shape_text: what ResumeExpectations::model_shape holds
#include "dstrain/ckpt/training_checkpoint.h"
#include "dstrain/model/model_config.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/train/model_gradients.h"

namespace dstrain {

// What a save writes of this rank's parameters and `optimizer`'s state (training_checkpoint.h):
// the replicated parameters as the data-parallel ranks share them; expert parallelism's experts,
// held by fewer ranks, by the first of their holders (or, under ZeRO-1, their optimizer state by
// each holder for its shard). `params` by their checkpoint names (RankStage::parameters); the
// optimizer's stacked expert states are named per expert, from `first_expert`, the global number
// of the first routed expert the rank holds (ckpt/expert_layout.h), here and in the loads below.
CheckpointContents checkpoint_contents(const NamedTensors& params, const AdamW& optimizer, ModelGradients& grads,
                                       int64_t first_expert, const TensorParallelPlacement& placement = {});
// Each rank's carried quantization error (comm.error_feedback) back from `reader`, when it was
// written on this layout; otherwise it starts from zero, and rank 0 says so.
void restore_error_feedback(const CheckpointReader& reader, ModelGradients& grads, bool same_layout);

struct ResumeExpectations {
  ModelConfig model;
  std::string model_shape;  // model_shape_text of the run's model
  std::string corpus_path, corpus_fingerprint;
  uint64_t global_batch = 0, seq_len = 0;
  std::string config;  // the run's effective configuration (INI)
  int64_t steps = 0;   // train.steps: from a checkpoint at or past it, no step follows
};
// Throws Error(kCheckpoint) naming what differs: another model (other shapes, or other tensors:
// an MTP module or the balancing bias more or fewer), another corpus; Error(kUsage) for a global
// batch, sequence length or seed that would change the data order. Warns when what the same
// tensors compute differs (RoPE, norms, routing), and when the learning-rate schedule differs (a
// longer train.steps moves the end of the decay, say) and steps follow: the run goes on with its own.
void check_resumable(const CheckpointReader& reader, const ResumeExpectations& expected);

// Copies this rank's masters (or parameters), moments and step count from the checkpoint into
// `optimizer` (only its shard of each, under ZeRO-1), and the rounded masters into the
// parameters it updates. Under ZeRO-1 the caller then gathers the parameters.
// `params`: every parameter of the rank; those the optimizer does not update (MoE's balancing
// bias) are read from "model/<name>".
void load_checkpoint(const CheckpointReader& reader, AdamW& optimizer, const NamedTensors& params,
                     int64_t first_expert, const TensorParallelPlacement& placement = {});

// A new run from a checkpoint's model alone (ckpt.load_weights): this rank's masters (or
// parameters) from the checkpoint's fp32 masters where it has them, else from its parameters;
// those the optimizer does not update from "model/<name>"; the moments and the step count stay
// as they are (fresh). Throws Error(kCheckpoint) naming the file and the tensor when one is missing
// or has another shape. Under ZeRO-1 the caller then gathers the parameters.
void load_weights(const CheckpointReader& reader, AdamW& optimizer, const NamedTensors& params,
                  int64_t first_expert, const TensorParallelPlacement& placement = {});

}  // namespace dstrain
