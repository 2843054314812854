// bench memory: copy bandwidth of host memory, device memory and the link between them, each
// counted as nccl-tests and STREAM count copies: bytes read plus bytes written for a copy within
// one memory, bytes moved for a copy between host and device.
#include <chrono>
#include <cstdio>

#include "bench.h"
#include "dstrain/core/blas.h"
#include "dstrain/core/accelerator.h"
#include "dstrain/core/log.h"
#include "dstrain/parallel/device.h"

namespace dstrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_per_copy(torch::Tensor& to, const torch::Tensor& from, int64_t iters, const torch::Device& device) {
  to.copy_(from);
  accel::synchronize(device);
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < iters; ++i) to.copy_(from, /*non_blocking=*/true);
  accel::synchronize(device);
  return std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(iters);
}

}  // namespace

nlohmann::json memory(const Options& o) {
  const DevicePlacement placement = place_rank(o.get_enum("train.device", device_request_names()));
  const torch::Device device = placement.device;
  const int64_t iters = o.get_int("bench.iters", 1);
  int64_t bytes = o.get_int("bench.bytes", 0);
  if (bytes == 0) bytes = device.is_cuda() ? (int64_t{1} << 30) : (int64_t{256} << 20);
  torch::set_num_threads(static_cast<int>(o.get_int("train.threads", 1, 1024)));
  blas::set_threads(static_cast<int>(o.get_int("train.threads", 1, 1024)));
  const int64_t count = bytes / 4;
  nlohmann::json rows = nlohmann::json::array();
  auto report = [&](const char* what, double moved, double seconds) {
    char line[128];
    std::snprintf(line, sizeof line, "  %-22s %10.1f GB/s", what, moved / seconds / 1e9);
    log::info(line);
    rows.push_back({{"copy", what}, {"bytes", moved}, {"seconds", seconds}, {"gbps", moved / seconds / 1e9}});
  };
  log::info("bench memory: ", format_bytes(static_cast<double>(bytes)), " per copy, ", iters, " copies, ",
            at::get_num_threads(), " host thread(s)");
  torch::Tensor host_a = torch::rand({count}), host_b = torch::empty({count});
  report("host -> host", 2.0 * bytes, seconds_per_copy(host_b, host_a, iters, torch::kCPU));
  if (device.is_cuda()) {
    auto on_device = torch::dtype(torch::kFloat32).device(device);
    torch::Tensor device_a = torch::rand({count}, on_device), device_b = torch::empty({count}, on_device);
    report("device -> device", 2.0 * bytes, seconds_per_copy(device_b, device_a, iters, device));
    torch::Tensor pinned = torch::rand({count}).pin_memory();
    report("host -> device (pinned)", 1.0 * bytes, seconds_per_copy(device_a, pinned, iters, device));
    report("device -> host (pinned)", 1.0 * bytes, seconds_per_copy(pinned, device_a, iters, device));
  }
  return {{"bench", "memory"}, {"device", placement.name}, {"results", rows}};
}

}  // namespace dstrain::bench
