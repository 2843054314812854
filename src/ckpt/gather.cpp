#include "dstrain/ckpt/gather.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "dstrain/model/moe.h"
#include "dstrain/model/parameter_shapes.h"

namespace dstrain {
namespace {

// Through the world communicator (its timeout applies): the header, then the names, then each
// tensor's bytes in pieces of at most 1 GiB (MPI counts are ints).
// Header: number of tensors, length of all names, then per tensor: name length, dtype, number
// of dimensions, the dimensions.
constexpr int64_t kPieceBytes = int64_t{1} << 30;

torch::Tensor bytes_of(const torch::Tensor& t) { return t.contiguous().view({-1}).view(torch::kUInt8); }

void send_pieces(MpiCommunicator& world, const torch::Tensor& t, int peer) {
  torch::Tensor bytes = bytes_of(t.detach().to(torch::kCPU));
  for (int64_t at = 0; at < bytes.numel(); at += kPieceBytes)
    world.send(bytes.narrow(0, at, std::min(kPieceBytes, bytes.numel() - at)), peer);
}

void receive_pieces(MpiCommunicator& world, torch::Tensor& t, int peer) {
  torch::Tensor bytes = bytes_of(t);
  for (int64_t at = 0; at < bytes.numel(); at += kPieceBytes) {
    torch::Tensor piece = bytes.narrow(0, at, std::min(kPieceBytes, bytes.numel() - at));
    world.recv(piece, peer);
  }
}

void send_stage(MpiCommunicator& world, const NamedTensors& params, int root) {
  std::vector<int64_t> header = {static_cast<int64_t>(params.size()), 0};
  std::string names;
  for (const auto& [name, t] : params) {
    header.insert(header.end(), {static_cast<int64_t>(name.size()), static_cast<int64_t>(t.scalar_type()), t.dim()});
    header.insert(header.end(), t.sizes().begin(), t.sizes().end());
    names += name;
  }
  header[1] = static_cast<int64_t>(names.size());
  world.send(torch::full({1}, static_cast<int64_t>(header.size()), torch::kInt64), root);
  world.send(torch::tensor(header, torch::kInt64), root);
  torch::Tensor name_bytes = torch::empty({static_cast<int64_t>(names.size())}, torch::kUInt8);
  std::memcpy(name_bytes.data_ptr(), names.data(), names.size());
  world.send(name_bytes, root);
  for (const auto& [name, t] : params) send_pieces(world, t, root);
}

void receive_stage(MpiCommunicator& world, int source, NamedTensors* out) {
  torch::Tensor header_size = torch::empty({1}, torch::kInt64);
  world.recv(header_size, source);
  torch::Tensor header_tensor = torch::empty({header_size.item<int64_t>()}, torch::kInt64);
  world.recv(header_tensor, source);
  const int64_t* header = header_tensor.data_ptr<int64_t>();
  torch::Tensor name_bytes = torch::empty({header[1]}, torch::kUInt8);
  world.recv(name_bytes, source);
  const std::string names(static_cast<const char*>(name_bytes.data_ptr()), static_cast<size_t>(header[1]));
  int64_t at = 2, name_at = 0;
  for (int64_t i = 0; i < header[0]; ++i) {
    const int64_t name_size = header[at], dtype = header[at + 1], dims = header[at + 2];
    std::vector<int64_t> shape(header + at + 3, header + at + 3 + dims);
    at += 3 + dims;
    torch::Tensor t = torch::empty(shape, torch::dtype(static_cast<torch::ScalarType>(dtype)));
    receive_pieces(world, t, source);
    out->emplace_back(names.substr(static_cast<size_t>(name_at), static_cast<size_t>(name_size)), t);
    name_at += name_size;
  }
}

}  // namespace

namespace {

// What `rank` sends: its replicated parameters when it is the first of their replicas (the whole
// ones only when it is also the first of its tp group; every rank of which sends its blocks of
// the split ones), its routed experts when it is the first of theirs.
struct Share {
  bool whole, split, experts;
  bool any() const { return whole || split || experts; }
  bool sends(const std::string& name) const {
    if (is_routed_expert_parameter(name)) return experts;
    return tensor_parallel_split(name) == TensorParallelSplit::kWhole ? whole : split;
  }
};
Share share_of(const ParallelGrid& grid, int rank) {
  const bool first_copy = grid.rank_in(Group::kDpCp, rank) == 0;
  return {first_copy && grid.rank_in(Group::kTp, rank) == 0, first_copy, grid.rank_in(Group::kEdp, rank) == 0};
}

// The tensor-parallel blocks of each split parameter joined in tp order; `blocks` by tp rank.
NamedTensors joined(NamedTensors whole, std::map<std::string, std::map<int, torch::Tensor>>& blocks) {
  for (auto& [name, by_rank] : blocks) {
    std::vector<torch::Tensor> in_order;
    for (auto& [tp_rank, block] : by_rank) in_order.push_back(block);
    whole.emplace_back(name, torch::cat(in_order, tensor_parallel_dim(name)));
  }
  return whole;
}

}  // namespace

NamedTensors gather_parameters(const NamedTensors& local, MpiCommunicator& world, const ParallelGrid& grid) {
  const bool split = grid.size(Group::kTp) > 1;
  if (world.rank() == 0) {  // the first of every set of replicas
    NamedTensors all;
    std::map<std::string, std::map<int, torch::Tensor>> blocks;
    auto take = [&](int rank, NamedTensors stage) {
      for (auto& [name, t] : stage)
        if (split && tensor_parallel_split(name) != TensorParallelSplit::kWhole)
          blocks[name][grid.rank_in(Group::kTp, rank)] = std::move(t);
        else
          all.emplace_back(name, std::move(t));
    };
    NamedTensors own;
    for (const auto& [name, t] : local) own.emplace_back(name, t.detach().to(torch::kCPU));
    take(0, std::move(own));
    for (int rank = 1; rank < grid.world(); ++rank) {
      if (!share_of(grid, rank).any()) continue;
      NamedTensors stage;
      receive_stage(world, rank, &stage);
      take(rank, std::move(stage));
    }
    all = joined(std::move(all), blocks);
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return all;
  }
  const Share share = share_of(grid, world.rank());
  if (!share.any()) return {};
  NamedTensors mine;
  for (const auto& named : local)
    if (share.sends(named.first)) mine.push_back(named);
  send_stage(world, mine, 0);
  return {};
}

}  // namespace dstrain
