#include "dstrain/core/step_memory.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "dstrain/core/accelerator.h"

namespace dstrain::accel {
namespace {

// Counts the bytes of the CPU tensors it allocates, forwarding to the allocator it replaced. Its
// data pointers are their own context, so that raw_allocate works as with LibTorch's (oneDNN
// allocates through it); the sizes wait in a table for the frees. LibTorch's Allocator interface
// differs between versions (allocate became non-const and copy_data appeared in 2.x): the
// overloads below fit either, each overriding the one its base declares.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner), inner_delete_(inner->raw_deleter()) {}

  c10::DataPtr allocate(size_t bytes) const { return counted(bytes); }
  c10::DataPtr allocate(size_t bytes) { return counted(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

  static CountingCpuAllocator* installed;  // the one instance, once installed

 private:
  static void release(void* data) {
    CountingCpuAllocator& self = *installed;
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      const auto held = self.sizes_.find(data);
      if (held != self.sizes_.end()) {
        self.current_ -= held->second;
        self.sizes_.erase(held);
      }
    }
    self.inner_delete_(data);
  }

  c10::DataPtr counted(size_t bytes) const {
    void* data = inner_->raw_allocate(bytes);
    int64_t now;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = static_cast<int64_t>(bytes);
      now = current_ += static_cast<int64_t>(bytes);
    }
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::Allocator* inner_;
  c10::DeleterFnPtr inner_delete_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, int64_t> sizes_;
  mutable std::atomic<int64_t> current_{0}, peak_{0};
};

CountingCpuAllocator* CountingCpuAllocator::installed = nullptr;

// Installed once, for the rest of the process: tensors it allocated may outlive any meter. Null
// where LibTorch's CPU allocator has no raw deleter to forward frees to (nothing is counted then).
CountingCpuAllocator* cpu_counter() {
  static CountingCpuAllocator* counter = []() -> CountingCpuAllocator* {
    c10::Allocator* inner = c10::GetCPUAllocator();
    if (inner->raw_deleter() == nullptr) return nullptr;
    CountingCpuAllocator::installed = new CountingCpuAllocator(inner);
    c10::SetCPUAllocator(CountingCpuAllocator::installed, /*priority=*/std::numeric_limits<uint8_t>::max());
    return CountingCpuAllocator::installed;
  }();
  return counter;
}

}  // namespace

StepMemoryMeter::StepMemoryMeter(const torch::Device& device) : device_(device) {
  if (!device.is_cuda()) cpu_counter();
}

void StepMemoryMeter::begin_step() {
  if (device_.is_cuda()) {
    start_ = begin_device_peak_window(device_);
  } else if (CountingCpuAllocator* counter = cpu_counter()) {
    counter->reset_peak();
    start_ = counter->current();
  }
}

void StepMemoryMeter::end_step() {
  int64_t peak = start_, now = start_;
  if (device_.is_cuda()) {
    peak = device_peak_window_bytes(device_);
    now = device_allocated_bytes(device_);
  } else if (const CountingCpuAllocator* counter = cpu_counter()) {
    peak = counter->peak();
    now = counter->current();
  }
  peak_ = std::max(peak_, peak - start_);
  activations_ = std::max(activations_, peak - std::max(start_, now));
  kept_ = std::max(kept_, now - start_);
}

}  // namespace dstrain::accel
