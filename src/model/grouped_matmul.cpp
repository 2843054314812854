#include "dstrain/model/grouped_matmul.h"

#include <atomic>
#include <exception>
#include <string>

#include "dstrain/core/log.h"
#include "dstrain/core/torch_compat.h"

namespace dstrain {
namespace {

// aten::_grouped_mm(Tensor self, Tensor mat2, Tensor? offs=None, Tensor? bias=None,
//                   ScalarType? out_dtype=None) -> Tensor, from LibTorch 2.8.
constexpr bool kHasGroupedMm = DSTRAIN_TORCH_AT_LEAST(2, 8);

std::atomic<bool> refused{false};  // a call failed: the loops compute from then on

void give_up(const std::string& why) {
  if (!refused.exchange(true))
    log::warning("LibTorch's grouped matrix product (aten::_grouped_mm) failed, so the experts' products run one "
                 "after another from now on: ", why);
}

// 16-byte rows and row starts in bf16, whichever way the operand is laid out.
bool aligned(const torch::Tensor& t) {
  for (int64_t size : t.sizes().slice(static_cast<size_t>(t.dim() - 2)))
    if (size % 8 != 0) return false;
  return true;
}

torch::Tensor call_grouped_mm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& offsets) {
#if DSTRAIN_TORCH_AT_LEAST(2, 8)
  return at::_grouped_mm(a, b, offsets);
#else
  (void)a, (void)b, (void)offsets;
  throw std::logic_error("aten::_grouped_mm needs LibTorch 2.8");
#endif
}

}  // namespace

bool grouped_matmul_available() { return kHasGroupedMm && !refused.load(); }

bool grouped_matmul_applies(const torch::Tensor& a, const torch::Tensor& b) {
  return a.is_cuda() && b.is_cuda() && a.scalar_type() == torch::kBFloat16 && b.scalar_type() == torch::kBFloat16 &&
         aligned(a) && aligned(b) && grouped_matmul_available();
}

torch::Tensor grouped_matmul(const torch::Tensor& a, const torch::Tensor& b, const std::vector<int64_t>& group_sizes) {
  if (!grouped_matmul_applies(a, b)) return {};
  std::vector<int32_t> ends;
  int32_t end = 0;
  for (int64_t size : group_sizes) ends.push_back(end += static_cast<int32_t>(size));
  // (From pageable memory, the copy has read `ends` when it returns; nothing waits for the device.)
  const torch::Tensor offsets = torch::tensor(ends, torch::kInt32).to(a.device(), /*non_blocking=*/true);
  try {
    torch::Tensor result = call_grouped_mm(a, b, offsets);
    // A group with none of K sums nothing: zero, whatever the kernel leaves there.
    if (b.dim() == 2)
      for (size_t g = 0; g < group_sizes.size(); ++g)
        if (group_sizes[g] == 0) result[static_cast<int64_t>(g)].zero_();
    return result;
  } catch (const std::exception& e) {
    give_up(e.what());
    return {};
  }
}

}  // namespace dstrain
