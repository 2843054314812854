#include "dstrain/ckpt/gather.h"

#include <algorithm>

#include "dstrain/dist/mpi_check.h"

namespace dstrain {
namespace {

// Per tensor: name length, dtype, number of dimensions, then the dimensions; then all names.
constexpr int kHeaderTag = 1, kNamesTag = 2, kDataTag = 3;

// MPI counts are ints: a tensor of more than 2 GiB travels in pieces.
constexpr int64_t kPieceBytes = int64_t{1} << 30;

void send_bytes(const torch::Tensor& t, int peer) {
  auto* data = static_cast<char*>(t.data_ptr());
  for (int64_t at = 0; at < static_cast<int64_t>(t.nbytes()); at += kPieceBytes) {
    const int count = static_cast<int>(std::min<int64_t>(kPieceBytes, static_cast<int64_t>(t.nbytes()) - at));
    MPI_CHECK(MPI_Send(data + at, count, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD));
  }
}

void receive_bytes(torch::Tensor& t, int peer) {
  auto* data = static_cast<char*>(t.data_ptr());
  for (int64_t at = 0; at < static_cast<int64_t>(t.nbytes()); at += kPieceBytes) {
    const int count = static_cast<int>(std::min<int64_t>(kPieceBytes, static_cast<int64_t>(t.nbytes()) - at));
    MPI_CHECK(MPI_Recv(data + at, count, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  }
}

void send_stage(const NamedTensors& params, int root) {
  std::vector<int64_t> header = {static_cast<int64_t>(params.size())};
  std::string names;
  for (const auto& [name, t] : params) {
    header.insert(header.end(), {static_cast<int64_t>(name.size()), static_cast<int64_t>(t.scalar_type()), t.dim()});
    header.insert(header.end(), t.sizes().begin(), t.sizes().end());
    names += name;
  }
  int64_t header_size = static_cast<int64_t>(header.size());
  MPI_CHECK(MPI_Send(&header_size, 1, MPI_INT64_T, root, kHeaderTag, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Send(header.data(), static_cast<int>(header.size()), MPI_INT64_T, root, kHeaderTag, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Send(names.data(), static_cast<int>(names.size()), MPI_CHAR, root, kNamesTag, MPI_COMM_WORLD));
  for (const auto& [name, t] : params) {
    send_bytes(t.detach().to(torch::kCPU).contiguous(), root);
  }
}

void receive_stage(int source, NamedTensors* out) {
  int64_t header_size = 0;
  MPI_CHECK(MPI_Recv(&header_size, 1, MPI_INT64_T, source, kHeaderTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  std::vector<int64_t> header(static_cast<size_t>(header_size));
  MPI_CHECK(MPI_Recv(header.data(), static_cast<int>(header_size), MPI_INT64_T, source, kHeaderTag, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE));
  MPI_Status status;
  MPI_CHECK(MPI_Probe(source, kNamesTag, MPI_COMM_WORLD, &status));
  int names_size = 0;
  MPI_CHECK(MPI_Get_count(&status, MPI_CHAR, &names_size));
  std::string names(static_cast<size_t>(names_size), '\0');
  MPI_CHECK(MPI_Recv(names.data(), names_size, MPI_CHAR, source, kNamesTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  size_t at = 1, name_at = 0;
  for (int64_t i = 0; i < header[0]; ++i) {
    const int64_t name_size = header[at], dtype = header[at + 1], dims = header[at + 2];
    std::vector<int64_t> shape(header.begin() + static_cast<int64_t>(at) + 3,
                               header.begin() + static_cast<int64_t>(at) + 3 + dims);
    at += 3 + static_cast<size_t>(dims);
    torch::Tensor t = torch::empty(shape, torch::dtype(static_cast<torch::ScalarType>(dtype)));
    receive_bytes(t, source);
    out->emplace_back(names.substr(name_at, static_cast<size_t>(name_size)), t);
    name_at += static_cast<size_t>(name_size);
  }
}

}  // namespace

NamedTensors gather_parameters(const NamedTensors& local, const ParallelContext& parallel) {
  const RankGrid& grid = parallel.grid;
  NamedTensors all;
  if (parallel.world_rank == 0) {
    for (const auto& [name, t] : local) all.emplace_back(name, t.detach().to(torch::kCPU));
    for (int stage = 1; stage < grid.pp(); ++stage) receive_stage(grid.rank_of({0, stage}), &all);
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  } else if (parallel.coord.dp == 0) {
    send_stage(local, 0);
  }
  return all;
}

}  // namespace dstrain
