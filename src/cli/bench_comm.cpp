// bench comm: all-reduce, reduce-scatter, all-gather and all-to-all over message sizes, with bus
// bandwidth as nccl-tests defines it (the figure to compare with the links' speed, whatever the
// rank count):
//   all-reduce       busbw = algbw × 2(n − 1)/n
//   reduce-scatter,
//   all-gather,
//   all-to-all       busbw = algbw × (n − 1)/n      (size: the whole n-chunk buffer)
// The all-to-all sends size/n to every rank, itself included, as expert parallelism's token
// exchange does with evenly loaded experts; the chunk a rank keeps crosses no link, hence (n − 1)/n.
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench.h"
#include "dstrain/core/log.h"
#include "dstrain/parallel/device.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/train/job.h"

namespace dstrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of `op`, after a few untimed calls.
template <typename Op>
double time_per_call(Communicator& comm, int64_t iters, Op&& op) {
  for (int i = 0; i < 3; ++i) op();
  comm.synchronize();
  comm.barrier();
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < iters; ++i) op();
  comm.synchronize();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(iters);
  // The slowest rank defines the collective's time.
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return seconds;
}

}  // namespace

nlohmann::json comm(const Options& o) {
  // Every rank in one data-parallel group, on the configured device and backend.
  const Job job = start_job([&](int world_size, int) {
    TrainConfig c;
    c.loop.threads = torch::get_num_threads();  // LibTorch's own choice: these benchmarks compute nothing
    c.loop.device = o.get_enum("train.device", device_request_names());
    c.comm.backend = o.get_enum("comm.backend", backend_names());
    c.comm.timeout_s = o.get_float("comm.timeout_s", 1.0, 1e7);
    c.parallel.dp = world_size;
    return c;
  });
  const int world_size = job.world_size;
  const DevicePlacement& placement = job.placement;
  Communicator& group = job.parallel->group(Group::kDp);
  const std::string backend = name_of(backend_names(), group.backend());
  const int64_t iters = o.get_int("bench.iters", 1);
  const int64_t min_bytes = o.get_int("bench.min_bytes", 4);
  int64_t max_bytes = o.get_int("bench.max_bytes", 0);
  if (max_bytes == 0) max_bytes = placement.device.is_cuda() ? (int64_t{1} << 30) : (int64_t{64} << 20);
  const double n = world_size;

  log::info("bench comm: ", world_size, " rank(s), backend ", backend, " on ", placement.name, ", fp32, ",
            iters, " iterations per size");
  log::info("      size  operation        time/us   algbw GB/s   busbw GB/s");
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    // A whole number of fp32 elements per rank.
    const int64_t count = std::max<int64_t>(1, bytes / 4 / world_size) * world_size;
    const double size = 4.0 * static_cast<double>(count);
    auto f32 = torch::dtype(torch::kFloat32).device(placement.device);
    torch::Tensor full = torch::ones({count}, f32), chunk = torch::ones({count / world_size}, f32);
    torch::Tensor exchanged = torch::empty({count}, f32);
    const std::vector<int64_t> equal_split(static_cast<size_t>(world_size), count / world_size);
    struct Measured {
      const char* name;
      double seconds, bus_factor;
    };
    Measured measured[] = {
        {"all_reduce", time_per_call(group, iters, [&] { group.all_reduce(full, ReduceOp::kSum); }), 2 * (n - 1) / n},
        {"reduce_scatter", time_per_call(group, iters, [&] { group.reduce_scatter(chunk, full, ReduceOp::kSum); }),
         (n - 1) / n},
        {"all_gather", time_per_call(group, iters, [&] { group.all_gather(full, chunk); }), (n - 1) / n},
        {"all_to_all",
         time_per_call(group, iters, [&] { group.all_to_all(exchanged, full, equal_split, equal_split); }),
         (n - 1) / n},
    };
    for (const Measured& m : measured) {
      const double algbw = size / m.seconds / 1e9;
      char line[160];
      std::snprintf(line, sizeof line, "%10s  %-15s %9.1f %12.2f %12.2f", format_bytes(size).c_str(), m.name,
                    m.seconds * 1e6, algbw, algbw * m.bus_factor);
      log::info(line);
      rows.push_back({{"bytes", size}, {"op", m.name}, {"seconds", m.seconds}, {"algbw_gbps", algbw},
                      {"busbw_gbps", algbw * m.bus_factor}});
    }
  }
  return {{"bench", "comm"}, {"ranks", world_size}, {"backend", backend}, {"device", placement.name}, {"results", rows}};
}

}  // namespace dstrain::bench
