// LibTorch's FP8 product (fp8_matmul.h). What each form asks of its operands, as LibTorch checks
// them (aten/src/ATen/native/cuda/ScaledBlas.cpp):
// - a row-major, b column-major (cuBLASLt's "TN", the only FP8 layout on Hopper), K and N
//   multiples of 16, any M; E4M3 operands; no fast accumulation, so products sum in fp32;
// - tensorwise and rowwise through aten::_scaled_mm, whose scales' shapes say the scaling: one
//   element each, or [M, 1] and [1, N];
// - experts through aten::_scaled_grouped_mm: a [Σ rows, K] row-major with a scale a row,
//   b [experts, K, N] column-major (each expert's [N, K] transposed) with scales [experts, N],
//   the groups by the int32 ends of their rows on the device; at most 1,023 groups;
// - blockwise through aten::_scaled_mm_v2 (LibTorch 2.10), which is told the tiles instead:
//   a's 1×128 scales [M, ⌈K/128⌉] column-major; b's 128×128 block scales [L4, ⌈N/128⌉]
//   column-major, L4 = ⌈K/128⌉ rounded up to 4, which cuBLASLt reads (the older form takes no
//   padding and is wrong where ⌈K/128⌉ is not a multiple of 4: K = 5,504, the 1B preset's down
//   projection); b's 1×128 scales [N, ⌈K/128⌉] column-major. Hopper only (compute capability 9.x).
#include "dstrain/model/fp8_matmul.h"

#include <optional>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/model/kernel_refusal.h"

#if DSTRAIN_TORCH_AT_LEAST(2, 10)
#include <ATen/BlasBackend.h>
#endif

namespace dstrain {
namespace {

constexpr bool kHasScaledMm = DSTRAIN_TORCH_AT_LEAST(2, 10);
constexpr int64_t kAlignment = 16;  // elements of K and N
constexpr size_t kMostGroups = 1023;
constexpr int64_t kEdge = kFp8TileEdge;

enum class Form { kNone, kTensorwise, kRowwise, kBlocks, kTiles };  // kBlocks: b 128×128; kTiles: b 1×128

Form form_of(const Fp8Tensor& a, const Fp8Tensor& b) {
  const Fp8Tile whole{0, 0}, row{1, 0}, tile{1, kEdge}, block{kEdge, kEdge};
  if (a.tile == whole && b.tile == whole) return Form::kTensorwise;
  if (a.tile == row && b.tile == row) return Form::kRowwise;
  if (a.tile == tile && b.tile == block) return Form::kBlocks;
  if (a.tile == tile && b.tile == tile) return Form::kTiles;
  return Form::kNone;
}

std::string tile_name(Fp8Tile t) {
  auto side = [](int64_t n) { return n == 0 ? std::string("all") : std::to_string(n); };
  return side(t.rows) + "×" + side(t.cols);
}

// Whether `q` has a scale for each row: one tile, or a tile a row.
bool one_scale_a_row(const Fp8Tensor& q) { return q.tile == Fp8Tile{0, 0} || q.tile == Fp8Tile{1, 0}; }
// That scale for each row: float32 [rows].
torch::Tensor row_scales(const Fp8Tensor& q) {
  return q.scales.reshape({-1, 1}).expand({q.codes.size(0), 1}).reshape({-1});
}

// E4M3 codes joined along a new first dimension (stack) or the first (cat), as bytes: LibTorch's
// joins need not take float8.
torch::Tensor joined(const std::vector<torch::Tensor>& codes, bool stack) {
  std::vector<torch::Tensor> bytes;
  for (const torch::Tensor& c : codes) bytes.push_back(c.contiguous().view(torch::kUInt8));
  return (stack ? torch::stack(bytes) : torch::cat(bytes)).view(codes.front().scalar_type());
}

#if DSTRAIN_TORCH_AT_LEAST(2, 10)
int64_t ceil_div(int64_t n, int64_t d) { return (n + d - 1) / d; }

// `codes` [rows, K] with zero columns up to a multiple of 16: zero codes add nothing to the sums
// (an expert's weight gradient contracts over its rows, which come in any number).
torch::Tensor padded_along_k(const torch::Tensor& codes) {
  const int64_t k = codes.size(1), padding = ceil_div(k, kAlignment) * kAlignment - k;
  const torch::Tensor bytes = codes.contiguous().view(torch::kUInt8);
  if (padding == 0) return bytes.view(codes.scalar_type());
  return torch::constant_pad_nd(bytes, {0, padding}, 0).view(codes.scalar_type());
}

// `scales` [rows, columns] laid out column-major, the layout LibTorch reads per-tile scales in.
torch::Tensor column_major(const torch::Tensor& scales) { return scales.t().contiguous().t(); }

torch::Tensor scaled_mm(const torch::Tensor& a, const torch::Tensor& b_t, const torch::Tensor& scale_a,
                        const torch::Tensor& scale_b) {
  return at::_scaled_mm(a, b_t, scale_a, scale_b, /*bias=*/std::nullopt, /*scale_result=*/std::nullopt,
                        torch::kBFloat16, /*use_fast_accum=*/false);
}

torch::Tensor scaled_mm_blockwise(const torch::Tensor& a, const torch::Tensor& b_t, const torch::Tensor& scale_a,
                                  const torch::Tensor& scale_b, bool b_in_blocks) {
  using at::blas::ScalingType;
  const auto recipe = [](ScalingType t) { return static_cast<int64_t>(t); };
  const std::vector<int64_t> recipe_a = {recipe(ScalingType::BlockWise1x128)};
  const std::vector<int64_t> recipe_b = {
      recipe(b_in_blocks ? ScalingType::BlockWise128x128 : ScalingType::BlockWise1x128)};
  const std::vector<int64_t> no_swizzle = {static_cast<int64_t>(at::blas::SwizzleType::NO_SWIZZLE)};
  const std::vector<torch::Tensor> scales_a = {scale_a}, scales_b = {scale_b};
  return at::_scaled_mm_v2(a, b_t, scales_a, recipe_a, no_swizzle, scales_b, recipe_b, no_swizzle,
                           /*bias=*/std::nullopt, torch::kBFloat16);
}
#endif

// The grouped kernel's operands: the rows of the experts that have some, in order, with a scale a
// row; every expert's b; the ends of the experts' rows.
struct GroupedOperands {
  std::vector<torch::Tensor> a_codes, a_scales, b_codes, b_scales;
  std::vector<int32_t> ends;
};

// Those of a and b, or nothing where one is not the kernel's: other tiles or shapes, K or N no
// multiple of 16.
std::optional<GroupedOperands> grouped_operands(const std::vector<Fp8Tensor>& a, const std::vector<Fp8Tensor>& b) {
  const int64_t n = b.front().codes.size(0), k = b.front().codes.size(1);
  if (n % kAlignment != 0 || k % kAlignment != 0) return std::nullopt;
  GroupedOperands operands;
  int32_t end = 0;
  for (size_t e = 0; e < a.size(); ++e) {
    if (!one_scale_a_row(b[e]) || b[e].codes.size(0) != n || b[e].codes.size(1) != k) return std::nullopt;
    operands.b_codes.push_back(b[e].codes);
    operands.b_scales.push_back(row_scales(b[e]));
    if (a[e].codes.defined() && a[e].codes.size(0) > 0) {
      if (!one_scale_a_row(a[e]) || a[e].codes.size(1) != k || !a[e].codes.is_cuda()) return std::nullopt;
      operands.a_codes.push_back(a[e].codes);
      operands.a_scales.push_back(row_scales(a[e]));
      end += static_cast<int32_t>(a[e].codes.size(0));
    }
    operands.ends.push_back(end);
  }
  return operands;
}

torch::Tensor call_grouped_kernel(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& scale_a,
                                  const torch::Tensor& scale_b, const torch::Tensor& ends) {
#if DSTRAIN_TORCH_AT_LEAST(2, 10)
  return at::_scaled_grouped_mm(a, b.transpose(-2, -1), scale_a, scale_b, ends, /*bias=*/std::nullopt,
                                /*scale_result=*/std::nullopt, torch::kBFloat16, /*use_fast_accum=*/false);
#else
  (void)a, (void)b, (void)scale_a, (void)scale_b, (void)ends;
  throw std::logic_error("aten::_scaled_grouped_mm needs LibTorch 2.10 here");
#endif
}

torch::Tensor call_kernel(const Fp8Tensor& a, const Fp8Tensor& b, Form form) {
#if DSTRAIN_TORCH_AT_LEAST(2, 10)
  const torch::Tensor a_codes = padded_along_k(a.codes), b_codes = padded_along_k(b.codes);
  const torch::Tensor mat2 = b_codes.t();  // [K, N] column-major
  switch (form) {
    case Form::kTensorwise:
      return scaled_mm(a_codes, mat2, a.scales.reshape({}), b.scales.reshape({}));
    case Form::kRowwise:
      return scaled_mm(a_codes, mat2, a.scales.contiguous(), b.scales.reshape({1, -1}).contiguous());
    case Form::kBlocks: {
      // b's block scales [⌈N/128⌉, ⌈K/128⌉], their rows padded to L4 (any value: 1).
      const int64_t k_blocks = b.scales.size(1), padding = ceil_div(k_blocks, 4) * 4 - k_blocks;
      const torch::Tensor b_scales = torch::constant_pad_nd(b.scales, {0, padding}, 1.0).contiguous().t();
      return scaled_mm_blockwise(a_codes, mat2, column_major(a.scales), b_scales, /*b_in_blocks=*/true);
    }
    case Form::kTiles:
      return scaled_mm_blockwise(a_codes, mat2, column_major(a.scales), column_major(b.scales),
                                 /*b_in_blocks=*/false);
    case Form::kNone:
      break;
  }
  throw std::logic_error("fp8 matmul: no form");
#else
  (void)a, (void)b, (void)form;
  throw std::logic_error("aten::_scaled_mm_v2 needs LibTorch 2.10");
#endif
}

}  // namespace

bool fp8_matmul_built() { return kHasScaledMm; }

bool fp8_grouped_kernel_on(int device) { return kHasScaledMm && accel::compute_capability(device) / 10 == 9; }

std::string fp8_matmul_refusal(const Fp8Tensor& a, const Fp8Tensor& b) {
  if (!kHasScaledMm) return "this build's LibTorch (" TORCH_VERSION ") has no aten::_scaled_mm_v2 (2.10 and later)";
  if (!a.codes.is_cuda() || !b.codes.is_cuda()) return "the operands are not on a GPU";
  const Form form = form_of(a, b);
  if (form == Form::kNone) return "no FP8 kernel takes tiles " + tile_name(a.tile) + " times " + tile_name(b.tile);
  const int capability = accel::compute_capability(a.codes.get_device());
  if (capability < 89) return "compute capability " + std::to_string(capability) + " has no FP8 tensor cores (8.9+)";
  if ((form == Form::kBlocks || form == Form::kTiles) && capability / 10 != 9)
    return "LibTorch runs 1×128 and 128×128 tiles on compute capability 9.x only, not " + std::to_string(capability);
  if (a.codes.size(1) != b.codes.size(1))
    return "K differs: " + std::to_string(a.codes.size(1)) + " against " + std::to_string(b.codes.size(1));
  if (b.codes.size(0) % kAlignment != 0) return "N = " + std::to_string(b.codes.size(0)) + " is no multiple of 16";
  return "";
}

torch::Tensor Fp8Matmul::operator()(const Fp8Tensor& a, const Fp8Tensor& b) {
  if (refused_.load() || !fp8_matmul_refusal(a, b).empty()) return {};
  if (a.codes.size(0) == 0) return torch::zeros({0, b.codes.size(0)}, a.codes.options().dtype(torch::kBFloat16));
  return unless_refused(refused_,
                        "LibTorch's FP8 matrix product (aten::_scaled_mm) failed, so FP8 products are emulated in fp32 "
                        "from now on: ",
                        [&] { return call_kernel(a, b, form_of(a, b)); });
}

bool Fp8Matmul::groups(const torch::Tensor& rows) const {
  return rows.is_cuda() && fp8_grouped_kernel_on(rows.get_device()) && !grouped_refused_.load();
}

torch::Tensor Fp8Matmul::grouped(const std::vector<Fp8Tensor>& a, const std::vector<Fp8Tensor>& b) {
  if (a.empty() || a.size() != b.size() || a.size() > kMostGroups || !groups(b.front().codes)) return {};
  const std::optional<GroupedOperands> operands = grouped_operands(a, b);
  if (!operands) return {};
  const torch::Device device = b.front().codes.device();
  if (operands->a_codes.empty())
    return torch::zeros({0, b.front().codes.size(0)}, torch::dtype(torch::kBFloat16).device(device));
  // (From pageable memory, the copy has read the ends when it returns; nothing waits for the device.)
  const torch::Tensor ends = torch::tensor(operands->ends, torch::kInt32).to(device, /*non_blocking=*/true);
  return unless_refused(grouped_refused_,
                        "LibTorch's grouped FP8 matrix product (aten::_scaled_grouped_mm) failed, so the experts' "
                        "FP8 products run one expert after another from now on: ",
                        [&] {
                          return call_grouped_kernel(joined(operands->a_codes, false), joined(operands->b_codes, true),
                                                     torch::cat(operands->a_scales), torch::stack(operands->b_scales),
                                                     ends);
                        });
}

}  // namespace dstrain
