// Reading a checkpoint's configuration and model parameters (checkpoint_model.h): what eval and
// generate start from, whatever layout wrote the checkpoint.
#include "dstrain/ckpt/checkpoint_model.h"

#include <map>
#include <set>
#include <sstream>

#include "dstrain/core/error.h"
#include "dstrain/parallel/parallel_grid.h"

namespace dstrain {
namespace {

std::string trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

}  // namespace

std::map<std::string, std::string> checkpoint_config_values(const std::string& config_text) {
  std::map<std::string, std::string> values;
  std::istringstream lines(config_text);
  std::string line, section;
  while (std::getline(lines, line)) {
    line = trimmed(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    values[section + "." + trimmed(line.substr(0, equals))] = trimmed(line.substr(equals + 1));
  }
  return values;
}

ParallelConfig checkpoint_layout(const std::string& config_text) {
  const std::map<std::string, std::string> values = checkpoint_config_values(config_text);
  auto size = [&](const std::string& key) {
    const auto value = values.find(key);
    if (value == values.end()) return 1;
    int ranks = 0;
    try {
      ranks = std::stoi(value->second);
    } catch (const std::exception&) {
    }
    if (ranks < 1)
      throw Error(ExitCode::kCheckpoint,
                  "the checkpoint's configuration has " + key + " = " + value->second + ", not a number of ranks");
    return ranks;
  };
  ParallelConfig layout;
  layout.tp = size("parallel.tp");
  layout.cp = size("parallel.cp");
  layout.dp = size("parallel.dp");
  layout.pp = size("parallel.pp");
  layout.ep = size("parallel.ep");
  const auto order = values.find("parallel.order");
  if (order != values.end()) layout.order = order->second;
  try {
    layout.order = ParallelGrid(layout).order();  // complete, and a grid
  } catch (const Error& e) {
    throw Error(ExitCode::kCheckpoint, std::string("the checkpoint's configuration: ") + e.what());
  }
  return layout;
}

std::vector<std::string> checkpoint_config_arguments(const std::string& config_text) {
  static const std::set<std::string> kept_sections = {"model", "train", "optim", "data"};
  static const std::set<std::string> left_out = {"train.device", "train.grad_accum"};
  std::vector<std::string> args;
  for (const auto& [key, value] : checkpoint_config_values(config_text)) {
    if (!kept_sections.count(key.substr(0, key.find('.')))) continue;
    if (value.empty() || left_out.count(key)) continue;  // empty: the default (nothing given)
    args.push_back("--" + key + "=" + value);
  }
  return args;
}

void load_model_parameters(const CheckpointReader& reader, const NamedTensors& params,
                           const TensorParallelPlacement& placement) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    const std::string dataset = "model/" + name;
    const CheckpointReader::DatasetInfo* info = reader.find(dataset);
    if (!info)
      throw Error(ExitCode::kCheckpoint, reader.path() + ": no dataset /" + dataset +
                                             ": a checkpoint of another model (compare `dstrain ckpt inspect`)");
    const TensorPart part = placement.of(name);
    const std::vector<int64_t> whole = part.whole_shape(param.sizes().vec());
    if (info->shape != whole)
      throw Error(ExitCode::kCheckpoint, reader.path() + ": /" + dataset + " has shape " + shape_text(info->shape) +
                                             ", the model expects " + shape_text(whole));
    param.copy_(read_tensor_part(reader, dataset, part, param.sizes().vec()));
  }
}

}  // namespace dstrain
