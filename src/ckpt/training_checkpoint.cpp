// A training run's parameters and optimizer state in a checkpoint, by dataset name
// (training_checkpoint.h).
#include "dstrain/ckpt/training_checkpoint.h"

#include <algorithm>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

std::string model_dataset(const std::string& name) { return "model/" + name; }
std::string master_dataset(const std::string& name) { return "optim/" + name + "/master"; }
std::string exp_avg_dataset(const std::string& name) { return "optim/" + name + "/exp_avg"; }
std::string exp_avg_sq_dataset(const std::string& name) { return "optim/" + name + "/exp_avg_sq"; }

// This rank's part of a dataset of `state`'s parameter, shaped as its master.
torch::Tensor read_part(const CheckpointReader& reader, const std::string& dataset, const OptimizerStateView& state) {
  return reader.read_range(dataset, state.offset, state.master.numel()).view(state.master.sizes());
}

}  // namespace

CheckpointContents checkpoint_contents(const NamedTensors& params, const std::vector<OptimizerStateView>& optimizer,
                                       bool sharded) {
  CheckpointContents contents;
  for (const auto& [name, param] : params) contents.replicated.emplace_back(model_dataset(name), param);
  for (const OptimizerStateView& s : optimizer) {
    std::vector<std::pair<std::string, torch::Tensor>> state;
    if (!s.master.is_same(s.param)) state.emplace_back(master_dataset(s.name), s.master);
    state.emplace_back(exp_avg_dataset(s.name), s.exp_avg);
    state.emplace_back(exp_avg_sq_dataset(s.name), s.exp_avg_sq);
    for (auto& [name, tensor] : state) {
      if (sharded)
        contents.owned.push_back({name, tensor.reshape({-1}), s.full_shape, s.offset});
      else
        contents.replicated.emplace_back(name, tensor);
    }
  }
  return contents;
}

void write_model_checkpoint(const std::string& path, const std::vector<std::string>& names,
                            const std::function<torch::Tensor(const std::string&)>& source,
                            const CheckpointState& state) {
  std::vector<std::string> datasets;
  for (const std::string& name : names) datasets.push_back(model_dataset(name));
  const size_t prefix = model_dataset("").size();
  write_checkpoint_file(
      path, datasets, [&](const std::string& dataset) { return source(dataset.substr(prefix)); }, state);
}

bool has_optimizer_state(const CheckpointReader& reader) {
  const auto& datasets = reader.datasets();
  return std::any_of(datasets.begin(), datasets.end(),
                     [](const CheckpointReader::DatasetInfo& d) { return d.name.compare(0, 6, "optim/") == 0; });
}

std::string weight_dataset(const CheckpointReader& reader, const std::string& name) {
  return reader.find(master_dataset(name)) ? master_dataset(name) : model_dataset(name);
}

void load_training_tensors(const CheckpointReader& reader, const std::vector<OptimizerStateView>& optimizer,
                           const NamedTensors& params) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    if (param.requires_grad()) continue;  // the optimizer's, below
    const CheckpointReader::DatasetInfo* info = reader.find(model_dataset(name));
    if (!info) throw Error(kCode, reader.path() + ": /model/" + name + " is missing (a checkpoint of another model?)");
    if (info->shape != param.sizes().vec())
      throw Error(kCode, reader.path() + ": /model/" + name + " has another shape than this model's");
    param.copy_(reader.read(model_dataset(name)));
  }
  for (const OptimizerStateView& s : optimizer) {
    for (const std::string& name : {model_dataset(s.name), exp_avg_dataset(s.name), exp_avg_sq_dataset(s.name)}) {
      const CheckpointReader::DatasetInfo* info = reader.find(name);
      if (!info) throw Error(kCode, reader.path() + ": /" + name + " is missing (a checkpoint of another model?)");
      if (info->shape != s.full_shape)
        throw Error(kCode, reader.path() + ": /" + name + " has another shape than this model's " + s.name);
    }
    // This rank's part only (the pieces of the file that hold it, each checked).
    s.master.copy_(read_part(reader, weight_dataset(reader, s.name), s));
    s.exp_avg.copy_(read_part(reader, exp_avg_dataset(s.name), s));
    s.exp_avg_sq.copy_(read_part(reader, exp_avg_sq_dataset(s.name), s));
  }
}

void load_master_weights(const CheckpointReader& reader, const std::vector<OptimizerStateView>& optimizer,
                         const NamedTensors& params) {
  torch::NoGradGuard no_grad;
  // The dataset to read `name` from, checked against the shape of the model's parameter.
  auto source = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const std::string dataset = weight_dataset(reader, name);
    const CheckpointReader::DatasetInfo* info = reader.find(dataset);
    if (!info)
      throw Error(kCode, reader.path() + ": no dataset /model/" + name +
                             ": the weights of another model (compare `dstrain ckpt inspect`)");
    if (info->shape != shape)
      throw Error(kCode, reader.path() + ": /" + dataset + " has shape " + shape_text(info->shape) + "; this model's " +
                             name + " has " + shape_text(shape));
    return dataset;
  };
  for (const auto& [name, param] : params)
    if (!param.requires_grad()) param.copy_(reader.read(source(name, param.sizes().vec())));
  for (const OptimizerStateView& s : optimizer)  // this rank's part only (ZeRO-1)
    s.master.copy_(read_part(reader, source(s.name, s.full_shape), s));
}

}  // namespace dstrain
