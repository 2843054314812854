#include "dstrain/core/step_memory.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>

#ifdef DSTRAIN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace dstrain::accel {

// Receives what LibTorch's CPU allocator reports to a memory profiler: every allocation and free
// of this thread, with its size (negative for a free).
class StepMemoryMeter::CpuCounter : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t bytes, int64_t, int64_t, c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    current += bytes;
    peak = std::max(peak, current);
  }
  bool memoryProfilingEnabled() const override { return true; }

  int64_t current = 0, peak = 0;  // relative to the step's start
};

StepMemoryMeter::StepMemoryMeter(const torch::Device& device) : device_(device) {
  if (!device.is_cuda()) counter_ = std::make_shared<CpuCounter>();
}

StepMemoryMeter::~StepMemoryMeter() = default;

void StepMemoryMeter::begin_step() {
#ifdef DSTRAIN_WITH_CUDA
  if (device_.is_cuda()) {
    namespace allocator = c10::cuda::CUDACachingAllocator;
    start_ = allocator::getDeviceStats(device_.index()).allocated_bytes[0].current;  // [0]: every pool
    allocator::resetPeakStats(device_.index());
    return;
  }
#endif
  counter_->current = counter_->peak = 0;
  reporting_ = std::make_shared<c10::DebugInfoGuard>(c10::DebugInfoKind::PROFILER_STATE, counter_);
}

void StepMemoryMeter::end_step() {
#ifdef DSTRAIN_WITH_CUDA
  if (device_.is_cuda()) {
    const int64_t peak = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0].peak;
    peak_ = std::max(peak_, peak - start_);
    return;
  }
#endif
  reporting_.reset();
  peak_ = std::max(peak_, counter_->peak);
}

}  // namespace dstrain::accel
