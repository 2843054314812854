#include "dstrain/core/accelerator.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>

#ifdef DSTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dstrain::accel {

bool cuda_compiled() {
#ifdef DSTRAIN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

// A "Key: N kB" line of a /proc file, in bytes; 0 where the file does not say.
int64_t proc_kib_field(const char* file, const std::string& wanted) {
  std::ifstream status(file);
  std::string key;
  int64_t kib = 0;
  while (status >> key) {
    if (key == wanted && status >> kib) return kib * 1024;
    status.ignore(1 << 16, '\n');
  }
  return 0;
}

// The process's peak resident memory (Linux's VmHWM).
int64_t host_peak_resident_bytes() { return proc_kib_field("/proc/self/status", "VmHWM:"); }

}  // namespace

int64_t host_available_bytes() { return proc_kib_field("/proc/meminfo", "MemAvailable:"); }

int device_count() { return cuda_compiled() && torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

#ifdef DSTRAIN_WITH_CUDA
std::string device_name(int index) { return at::cuda::getDeviceProperties(index)->name; }
std::string device_uuid(int index) {
  const cudaUUID_t& uuid = at::cuda::getDeviceProperties(index)->uuid;
  return std::string(uuid.bytes, sizeof uuid.bytes);
}
int64_t device_total_memory(int index) {
  return static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
}
int compute_capability(int index) {
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(index);
  return 10 * properties->major + properties->minor;
}
void set_current_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }
void synchronize(const torch::Device& device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}
HostSyncForbidden::HostSyncForbidden(bool active) : active_(active) {
  if (active_) c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
}
HostSyncForbidden::~HostSyncForbidden() {
  if (active_) c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
}
HostSyncExpected::HostSyncExpected()
    : previous_mode_(static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode())) {
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
}
HostSyncExpected::~HostSyncExpected() {
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(previous_mode_));
}
// Index 0 of each statistic array is the aggregate over every pool.
namespace {
// The peak of each GPU before the last restart of its statistic (begin_device_peak_window).
int64_t run_peak_before_window[64] = {};
}  // namespace

int64_t peak_allocated_bytes(const torch::Device& device) {
  if (!device.is_cuda()) return host_peak_resident_bytes();
  return std::max(run_peak_before_window[device.index()],
                  c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak);
}
int64_t begin_device_peak_window(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  namespace allocator = c10::cuda::CUDACachingAllocator;
  const auto stats = allocator::getDeviceStats(device.index()).allocated_bytes[0];  // [0]: every pool
  int64_t& run_peak = run_peak_before_window[device.index()];
  run_peak = std::max(run_peak, stats.peak);
  allocator::resetPeakStats(device.index());
  return stats.current;
}
int64_t device_peak_window_bytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
}
int64_t device_allocated_bytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
}
#else
std::string device_name(int) { return "cpu"; }
std::string device_uuid(int) { return std::string(16, '\0'); }
int64_t device_total_memory(int) { return 0; }
int compute_capability(int) { return 0; }
void set_current_device(int) {}
void synchronize(const torch::Device&) {}
HostSyncForbidden::HostSyncForbidden(bool active) : active_(active) {}
HostSyncForbidden::~HostSyncForbidden() = default;
HostSyncExpected::HostSyncExpected() = default;
HostSyncExpected::~HostSyncExpected() = default;
int64_t peak_allocated_bytes(const torch::Device&) { return host_peak_resident_bytes(); }
int64_t begin_device_peak_window(const torch::Device&) { return 0; }
int64_t device_peak_window_bytes(const torch::Device&) { return 0; }
int64_t device_allocated_bytes(const torch::Device&) { return 0; }
#endif

Timestamp Timestamp::now(const torch::Device& device) {
  Timestamp t;
#ifdef DSTRAIN_WITH_CUDA
  if (device.is_cuda()) {
    auto event = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);  // with timing
    event->record(at::cuda::getCurrentCUDAStream(device.index()));
    t.event_ = event;
    return t;
  }
#else
  (void)device;
#endif
  t.host_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return t;
}

double Timestamp::seconds_since(const Timestamp& earlier) const {
#ifdef DSTRAIN_WITH_CUDA
  if (event_ && earlier.event_) {
    auto* later_event = static_cast<at::cuda::CUDAEvent*>(event_.get());
    later_event->synchronize();
    return static_cast<at::cuda::CUDAEvent*>(earlier.event_.get())->elapsed_time(*later_event) / 1000.0;
  }
#endif
  return host_seconds_ - earlier.host_seconds_;
}

}  // namespace dstrain::accel
