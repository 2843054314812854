// A training run's tensors in a checkpoint: the dataset names of its parameters and optimizer
// state, what a save writes and what a resume or a start from weights reads. The optimizer is
// seen through plain views of its tensors, so that the file's layout is known here alone and the
// optimizer knows nothing of files.
#pragma once

#include "dstrain/core/torch_api.h"

#include <functional>
#include <string>
#include <vector>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/checkpoint_writer.h"
#include "dstrain/ckpt/parameter_file.h"

namespace dstrain {

// One parameter's optimizer state as a checkpoint stores it. The tensors are the optimizer's own
// (handles, not copies): loading writes into them.
struct OptimizerStateView {
  std::string name;  // the parameter's global name
  torch::Tensor param, master, exp_avg, exp_avg_sq;  // master is param itself for fp32 models
  std::vector<int64_t> full_shape;  // of the rank's parameter; the tensors may be a shard of it ...
  int64_t offset = 0;               // ... starting at this element of the flattened parameter
};

// Where a rank's tensor of a parameter lies in the whole one: all of it, or under tensor
// parallelism the index-th of `parts` equal blocks of rows (dim 0) or of columns (dim 1).
struct TensorPart {
  int64_t dim = -1;  // -1: the whole tensor
  int64_t index = 0, parts = 1;

  bool whole() const { return dim < 0; }
  // The whole tensor's shape, of which a tensor of shape `local` is this part.
  std::vector<int64_t> whole_shape(std::vector<int64_t> local) const {
    if (!whole()) local.at(static_cast<size_t>(dim)) *= parts;
    return local;
  }
};

// Tensor parallelism in a checkpoint: each parameter's part by global name, and which of the
// ranks holding the same tensors write them.
struct TensorParallelPlacement {
  std::function<TensorPart(const std::string&)> part;  // empty: every tensor whole
  bool writes_whole = true;         // the whole tensors (the tp group's first rank, with its replicas)
  bool writes_replicated_parts = true;  // the blocks the data-parallel replicas hold alike (their first)

  TensorPart of(const std::string& name) const { return part ? part(name) : TensorPart{}; }
};

// "model/<name>" (the parameter as the model holds it; `params`), "optim/<name>/master"
// (bf16/fp16 models), "optim/<name>/exp_avg", "optim/<name>/exp_avg_sq" for every state of
// `optimizer`: whole when the data-parallel ranks hold the same state, as pieces of the whole
// datasets when `sharded` (ZeRO-1) or split by tensor parallelism (`placement`).
struct CheckpointContents {
  NamedTensors replicated;
  std::vector<DatasetPiece> owned;
};
CheckpointContents checkpoint_contents(const NamedTensors& params, const std::vector<OptimizerStateView>& optimizer,
                                       bool sharded, const TensorParallelPlacement& placement = {});

// A checkpoint of a model alone, written whole by one process (an import, ckpt.save_final's
// final_model.h5): the parameters `names`, each asked of `source` by name and stored as
// "model/<name>" in the tensor's dtype, then `state`; as write_checkpoint_file writes it.
void write_model_checkpoint(const std::string& path, const std::vector<std::string>& names,
                            const std::function<torch::Tensor(const std::string&)>& source,
                            const CheckpointState& state);

// Whether the checkpoint holds optimizer state (a run's) rather than a model alone (an import, a
// run's final_model.h5).
bool has_optimizer_state(const CheckpointReader& reader);

// The dataset with the most precise weight of parameter `name`: its fp32 master where the
// checkpoint has one (a bf16/fp16 run), else "model/<name>".
std::string weight_dataset(const CheckpointReader& reader, const std::string& name);

// This rank's `part` (of shape `local`) of the whole tensor stored in `dataset`, reading only that
// part where the file allows (CheckpointReader::read_range for blocks of rows, read_columns for
// blocks of columns).
torch::Tensor read_tensor_part(const CheckpointReader& reader, const std::string& dataset, const TensorPart& part,
                               const std::vector<int64_t>& local);

// A resume: copies this rank's part of each master (or parameter) and moment into `optimizer`'s
// tensors (their shard of each, under ZeRO-1), and the parameters the optimizer does not update
// (MoE's balancing bias: those of `params` without requires_grad) from "model/<name>". Throws
// Error(kCheckpoint) naming the file and dataset when one is missing or has another shape.
void load_training_tensors(const CheckpointReader& reader, const std::vector<OptimizerStateView>& optimizer,
                           const NamedTensors& params, const TensorParallelPlacement& placement = {});

// A new run from a checkpoint's model alone: this rank's part of each master from the
// checkpoint's weight_dataset, and the parameters the optimizer does not update from
// "model/<name>"; the moments are left as they are. Throws Error(kCheckpoint) naming the file and
// the tensor when one is missing or has another shape.
void load_master_weights(const CheckpointReader& reader, const std::vector<OptimizerStateView>& optimizer,
                         const NamedTensors& params, const TensorParallelPlacement& placement = {});

}  // namespace dstrain
