#include "dstrain/model/grouped_matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "dstrain/core/torch_compat.h"
#include "dstrain/model/kernel_refusal.h"

namespace dstrain {
namespace {

// aten::_grouped_mm(Tensor self, Tensor mat2, Tensor? offs=None, Tensor? bias=None,
//                   ScalarType? out_dtype=None) -> Tensor, from LibTorch 2.8.
constexpr bool kHasGroupedMm = DSTRAIN_TORCH_AT_LEAST(2, 8);

// As LibTorch checks each operand (its kernel reads them by TMA): 16-byte aligned data, one of the
// last two dimensions contiguous and the other's stride a multiple of 16 bytes (8 in bf16).
bool laid_out_for_the_kernel(const torch::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  const int64_t rows = t.dim() - 2, columns = t.dim() - 1;
  if (t.stride(columns) == 1) return t.stride(rows) % 8 == 0 && t.stride(rows) >= std::max<int64_t>(1, t.size(columns));
  if (t.stride(rows) == 1) return t.stride(columns) % 8 == 0 && t.stride(columns) >= std::max<int64_t>(1, t.size(rows));
  return false;
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

bool grouped_matmul_built() { return kHasGroupedMm; }

bool grouped_matmul_applies(const torch::Tensor& a, const torch::Tensor& b) {
  // (A result row of a multiple of 8 is dense: LibTorch pads the others.)
  return kHasGroupedMm && a.is_cuda() && b.is_cuda() && a.scalar_type() == torch::kBFloat16 &&
         b.scalar_type() == torch::kBFloat16 && a.dim() == 2 && (b.dim() == 2 || b.dim() == 3) && a.numel() > 0 &&
         b.size(-1) % 8 == 0 && laid_out_for_the_kernel(a) && laid_out_for_the_kernel(b);
}

torch::Tensor GroupedMatmul::operator()(const torch::Tensor& a, const torch::Tensor& b,
                                        const std::vector<int64_t>& group_sizes) {
  if (refused_.load() || !grouped_matmul_applies(a, b)) return {};
  std::vector<int32_t> ends;
  int32_t end = 0;
  for (int64_t size : group_sizes) ends.push_back(end += static_cast<int32_t>(size));
  // (From pageable memory, the copy has read `ends` when it returns; nothing waits for the device.)
  const torch::Tensor offsets = torch::tensor(ends, torch::kInt32).to(a.device(), /*non_blocking=*/true);
  return unless_refused(refused_,
                        "LibTorch's grouped matrix product (aten::_grouped_mm) failed, so the experts' products run "
                        "one after another from now on: ",
                        [&] {
                          torch::Tensor result = call_grouped_mm(a, b, offsets);
                          // A group with none of K sums nothing: zero, whatever the kernel leaves there.
                          if (b.dim() == 2)
                            for (size_t g = 0; g < group_sizes.size(); ++g)
                              if (group_sizes[g] == 0) result[static_cast<int64_t>(g)].zero_();
                          return result;
                        });
}

}  // namespace dstrain
