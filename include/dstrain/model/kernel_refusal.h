// How a LibTorch kernel that a build has but a GPU or LibTorch version may still refuse
// (aten::_grouped_mm, aten::_scaled_mm and their kin) is given up: its first failure is said once,
// as a warning, and from then on its callers compute the same another way.
#pragma once

#include "dstrain/core/torch_api.h"

#include <atomic>
#include <exception>

#include "dstrain/core/log.h"

namespace dstrain {

// `product()`, or, should LibTorch throw, an undefined tensor, now and (through `refused`, which
// the caller checks first) from then on, said once as a warning: `consequence` and LibTorch's words.
template <typename Product>
torch::Tensor unless_refused(std::atomic<bool>& refused, const char* consequence, Product product) {
  try {
    return product();
  } catch (const std::exception& e) {
    if (!refused.exchange(true)) log::warning(consequence, e.what());
    return {};
  }
}

}  // namespace dstrain
