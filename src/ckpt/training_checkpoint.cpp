// A training run's parameters and optimizer state in a checkpoint, by dataset name
// (training_checkpoint.h).
#include "dstrain/ckpt/training_checkpoint.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

std::string model_dataset(const std::string& name) { return "model/" + name; }
std::string master_dataset(const std::string& name) { return "optim/" + name + "/master"; }
std::string exp_avg_dataset(const std::string& name) { return "optim/" + name + "/exp_avg"; }
std::string exp_avg_sq_dataset(const std::string& name) { return "optim/" + name + "/exp_avg_sq"; }

// The pieces of the whole dataset that elements [offset, offset + flat.numel()) of a rank's
// tensor (of shape `local`, `part` of the whole) are: one run of elements, or for a block of
// columns its partial first and last rows and the whole rows between (a block of rows).
std::vector<DatasetPiece> place(const std::string& dataset, const torch::Tensor& flat,
                                const std::vector<int64_t>& local, int64_t offset, const TensorPart& part) {
  const std::vector<int64_t> shape = part.whole_shape(local);
  if (part.dim != 1) {
    const int64_t first = part.whole() ? 0 : part.index * c10::multiply_integers(local);
    return {{dataset, flat, shape, first + offset}};
  }
  const int64_t width = local.at(1), row = shape.at(1), first_column = part.index * width;
  const int64_t trailing = c10::multiply_integers(local.begin() + 2, local.end());  // (none: 2-D)
  if (trailing != 1)
    throw std::invalid_argument(dataset + ": a block of columns of a tensor of more than 2 dimensions");
  auto at = [&](int64_t local_element) { return local_element / width * row + first_column + local_element % width; };
  std::vector<DatasetPiece> pieces;
  for (int64_t taken = 0, n = flat.numel(); taken < n;) {
    const int64_t element = offset + taken, in_row = element % width;
    const int64_t rows = in_row == 0 ? (n - taken) / width : 0;
    const int64_t count = rows > 0 ? rows * width : std::min(width - in_row, n - taken);
    pieces.push_back({dataset, flat.narrow(0, taken, count), shape, at(element), std::max<int64_t>(rows, 1), row});
    taken += count;
  }
  return pieces;
}

// This rank's part of a dataset of `state`'s parameter (elements [offset, offset + numel) of its
// `part` of the whole), shaped as its master.
torch::Tensor read_part(const CheckpointReader& reader, const std::string& dataset, const OptimizerStateView& state,
                        const TensorPart& part) {
  const int64_t count = state.master.numel();
  torch::Tensor values;
  if (part.dim == 1) {  // a block of columns: its rows are not one range of the dataset
    values = read_tensor_part(reader, dataset, part, state.full_shape).reshape({-1}).narrow(0, state.offset, count);
  } else {
    const int64_t first = part.whole() ? 0 : part.index * c10::multiply_integers(state.full_shape);
    values = reader.read_range(dataset, first + state.offset, count);
  }
  return values.view(state.master.sizes());
}

// Throws naming the file and dataset when `info` is missing or not the whole of `full_shape`'s `part`.
void check_dataset(const CheckpointReader& reader, const std::string& dataset,
                   const CheckpointReader::DatasetInfo* info, const std::vector<int64_t>& full_shape,
                   const TensorPart& part, const std::string& what) {
  if (!info) throw Error(kCode, reader.path() + ": /" + dataset + " is missing (a checkpoint of another model?)");
  const std::vector<int64_t> shape = part.whole_shape(full_shape);
  if (info->shape != shape)
    throw Error(kCode, reader.path() + ": /" + dataset + " has shape " + shape_text(info->shape) + "; this model's " +
                           what + " has " + shape_text(shape));
}

}  // namespace

CheckpointContents checkpoint_contents(const NamedTensors& params, const std::vector<OptimizerStateView>& optimizer,
                                       bool sharded, const TensorParallelPlacement& placement) {
  CheckpointContents contents;
  // A tensor the data-parallel replicas hold alike: shared among them when whole, written by
  // their first when a part. `pieces`: this rank's alone (ZeRO-1's shards).
  auto add = [&](const std::string& dataset, const torch::Tensor& tensor, const std::vector<int64_t>& local,
                 int64_t offset, const TensorPart& part, bool alike) {
    if (part.whole() ? !placement.writes_whole : alike && !placement.writes_replicated_parts) return;
    if (part.whole() && alike) {
      contents.replicated.emplace_back(dataset, tensor);
      return;
    }
    for (DatasetPiece& piece : place(dataset, tensor.reshape({-1}), local, offset, part))
      contents.owned.push_back(std::move(piece));
  };
  for (const auto& [name, param] : params)
    add(model_dataset(name), param, param.sizes().vec(), 0, placement.of(name), true);
  for (const OptimizerStateView& s : optimizer) {
    std::vector<std::pair<std::string, torch::Tensor>> state;
    if (!s.master.is_same(s.param)) state.emplace_back(master_dataset(s.name), s.master);
    state.emplace_back(exp_avg_dataset(s.name), s.exp_avg);
    state.emplace_back(exp_avg_sq_dataset(s.name), s.exp_avg_sq);
    for (auto& [name, tensor] : state) add(name, tensor, s.full_shape, s.offset, placement.of(s.name), !sharded);
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

torch::Tensor read_tensor_part(const CheckpointReader& reader, const std::string& dataset, const TensorPart& part,
                               const std::vector<int64_t>& local) {
  if (part.whole()) return reader.read(dataset);
  const int64_t elements = c10::multiply_integers(local);
  if (part.dim == 0) return reader.read_range(dataset, part.index * elements, elements).view(local);
  const int64_t width = local.at(1);  // (a block of columns of a 2-D tensor: place() takes no other)
  return reader.read_columns(dataset, part.index * width, width).view(local);
}

std::string weight_dataset(const CheckpointReader& reader, const std::string& name) {
  return reader.find(master_dataset(name)) ? master_dataset(name) : model_dataset(name);
}

void load_training_tensors(const CheckpointReader& reader, const std::vector<OptimizerStateView>& optimizer,
                           const NamedTensors& params, const TensorParallelPlacement& placement) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    if (param.requires_grad()) continue;  // the optimizer's, below
    const std::string dataset = model_dataset(name);
    check_dataset(reader, dataset, reader.find(dataset), param.sizes().vec(), placement.of(name), name);
    param.copy_(reader.read(dataset));
  }
  for (const OptimizerStateView& s : optimizer) {
    const TensorPart part = placement.of(s.name);
    for (const std::string& name : {model_dataset(s.name), exp_avg_dataset(s.name), exp_avg_sq_dataset(s.name)})
      check_dataset(reader, name, reader.find(name), s.full_shape, part, s.name);
    // This rank's part only (the pieces of the file that hold it, each checked).
    s.master.copy_(read_part(reader, weight_dataset(reader, s.name), s, part));
    s.exp_avg.copy_(read_part(reader, exp_avg_dataset(s.name), s, part));
    s.exp_avg_sq.copy_(read_part(reader, exp_avg_sq_dataset(s.name), s, part));
  }
}

void load_master_weights(const CheckpointReader& reader, const std::vector<OptimizerStateView>& optimizer,
                         const NamedTensors& params, const TensorParallelPlacement& placement) {
  torch::NoGradGuard no_grad;
  // The dataset to read `name` from, checked against the shape of the model's parameter.
  auto source = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const std::string dataset = weight_dataset(reader, name);
    const CheckpointReader::DatasetInfo* info = reader.find(dataset);
    if (!info)
      throw Error(kCode, reader.path() + ": no dataset /model/" + name +
                             ": the weights of another model (compare `dstrain ckpt inspect`)");
    check_dataset(reader, dataset, info, shape, placement.of(name), name);
    return dataset;
  };
  for (const auto& [name, param] : params)
    if (!param.requires_grad()) param.copy_(reader.read(source(name, param.sizes().vec())));
  for (const OptimizerStateView& s : optimizer)  // this rank's part only (ZeRO-1, tensor parallelism)
    s.master.copy_(read_part(reader, source(s.name, s.full_shape), s, placement.of(s.name)));
}

}  // namespace dstrain
