// What the rest of dstrain needs to know about the GPU, without including CUDA headers: whether
// this LibTorch has CUDA, how many devices a node has, their names and memory, and the
// caching allocator's peak (the process's, on the CPU). A CPU-only build answers "no GPU" and never fails.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dstrain/core/torch_api.h"

namespace dstrain::accel {

bool cuda_compiled();  // LibTorch built with CUDA (and dstrain with it)
int device_count();    // 0 without CUDA
std::string device_name(int index);
// The GPU's UUID (16 bytes): the same physical GPU gives the same UUID in every process, however
// CUDA_VISIBLE_DEVICES numbers it there.
std::string device_uuid(int index);
int64_t device_total_memory(int index);
// CUDA's compute capability as major × 10 + minor (90: H100 and H200); 0 without CUDA.
int compute_capability(int index);
// What the host's processes can still take without swapping (Linux's MemAvailable); 0 where /proc
// does not say.
int64_t host_available_bytes();

// Makes `index` this process's current GPU: kernels, NCCL and the caching allocator use it.
void set_current_device(int index);

// Waits for every kernel queued on `device` (a no-op on the CPU).
void synchronize(const torch::Device& device);

// While one is alive, a LibTorch operation that would make the host wait for the GPU (reading a
// scalar, a blocking copy to the host, synchronising a LibTorch stream) throws c10::Error instead:
// how a test shows that a training step queues its work without waiting for it. Waits outside
// those (a device synchronisation, CUDA events, raw CUDA calls) go unseen. LibTorch's switch is
// one for the process, so one at a time; nothing happens without CUDA or when inactive.
class HostSyncForbidden {
 public:
  explicit HostSyncForbidden(bool active);
  ~HostSyncForbidden();
  HostSyncForbidden(const HostSyncForbidden&) = delete;
  HostSyncForbidden& operator=(const HostSyncForbidden&) = delete;

 private:
  bool active_;
};

// Inside a HostSyncForbidden scope, the one wait a step makes by design: MoE's per-expert batch
// sizes, which the host needs to cut the experts' matrix products (as Megatron's dropless MoE
// does). Waiting is allowed while one is alive; the mode before it comes back at its end.
class HostSyncExpected {
 public:
  HostSyncExpected();
  ~HostSyncExpected();
  HostSyncExpected(const HostSyncExpected&) = delete;
  HostSyncExpected& operator=(const HostSyncExpected&) = delete;

 private:
  int previous_mode_ = 0;
};

// Peak memory on `device` so far: on a GPU the bytes held by tensors (the caching
// allocator's count); on the CPU, which has no such counter, the process's peak resident memory
// (libraries and the rest of the process included).
int64_t peak_allocated_bytes(const torch::Device& device);

// A GPU's peak of tensor bytes over a window (a training step): begin returns the bytes held now
// and restarts the allocator's peak statistic, keeping the run's peak for peak_allocated_bytes;
// the window's peak is then read without waiting for the GPU. 0 on the CPU.
int64_t begin_device_peak_window(const torch::Device& device);
int64_t device_peak_window_bytes(const torch::Device& device);
// The bytes a GPU's tensors hold now, without waiting for it. 0 on the CPU.
int64_t device_allocated_bytes(const torch::Device& device);

// A point in the work queued on a device, to measure intervals of it without waiting for it: on a
// GPU a CUDA event (it takes its time when the kernels queued before it have run), on the CPU,
// where work is done when it is queued, the host clock.
class Timestamp {
 public:
  static Timestamp now(const torch::Device& device);
  // Seconds from `earlier` to this one; waits until this one has been reached.
  double seconds_since(const Timestamp& earlier) const;

 private:
  double host_seconds_ = 0;
  std::shared_ptr<void> event_;  // a CUDA event, on a GPU
};

}  // namespace dstrain::accel
