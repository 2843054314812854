// A named part of a training step (attention, the MLP, the optimizer, ...) as LibTorch's profiler
// sees it: a user-scope range around the part's forward computation, from which a step profile
// (report/step_profile.h) attributes each operation and device kernel to the part, the backward
// pass's through the autograd sequence number that links each backward node to its forward
// operation. When no profiler runs a scope costs LibTorch's check for its callbacks, about 23 ns on
// the CPU (bench/RESULTS.md).
#pragma once

#include <ATen/record_function.h>

namespace dstrain {

// The parts' labels, as the profile's table names them after the prefix.
constexpr const char* kProfilePartPrefix = "dstrain::";
namespace profile_part {
constexpr const char* kEmbedding = "dstrain::embedding";
constexpr const char* kAttention = "dstrain::attention";
constexpr const char* kMlp = "dstrain::mlp";
constexpr const char* kMoE = "dstrain::moe";
constexpr const char* kNorm = "dstrain::norm";
constexpr const char* kLoss = "dstrain::loss";
constexpr const char* kOptimizer = "dstrain::optimizer";
constexpr const char* kCommunication = "dstrain::communication";
}  // namespace profile_part

class ProfileScope {
 public:
  explicit ProfileScope(const char* part) : range_(at::RecordScope::USER_SCOPE) {
    if (range_.isActive()) range_.before(part);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  at::RecordFunction range_;
};

}  // namespace dstrain
