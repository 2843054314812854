#include "dstrain/model/rope.h"

#include <algorithm>
#include <cmath>

#ifdef DSTRAIN_WITH_CUDA_KERNELS
#include <torch/csrc/autograd/custom_function.h>

#include "cuda/launch.h"
#endif

namespace dstrain {

namespace {

double yarn_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

// The pair index whose rotation count over `length` positions is `rotations` (YaRN's correction
// dimension), for a head of dimension d.
double pair_turning(double rotations, int64_t d, double theta, int64_t length) {
  return static_cast<double>(d) * std::log(static_cast<double>(length) / (rotations * 2 * M_PI)) / (2 * std::log(theta));
}

#ifdef DSTRAIN_WITH_CUDA_KERNELS
// x rotated by the tables' angles (backwards with `inverse`), by the kernel of cuda/rope.cu.
torch::Tensor rotated(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool interleave,
                      bool inverse) {
  const torch::Tensor in = x.stride(3) == 1 ? x : x.contiguous();
  torch::Tensor out = torch::empty_like(in);  // the same layout where `in` is dense, else contiguous
  cuda::RopeLayout layout{in.size(0), in.size(1), in.size(2), in.size(3), {}, {}};
  for (int d = 0; d < 3; ++d) layout.in_strides[d] = in.stride(d), layout.out_strides[d] = out.stride(d);
  const c10::cuda::CUDAGuard guard(in.device());
  C10_CUDA_CHECK(cuda::rope(in.data_ptr(), out.data_ptr(), *cuda::element_of(in), layout, cos.data_ptr<float>(),
                            sin.data_ptr<float>(), cos.stride(0), interleave, inverse, cuda::stream_of(in)));
  return out;
}

class FusedRope : public torch::autograd::Function<FusedRope> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin, bool interleave) {
    ctx->saved_data["cos"] = cos;  // constant tables: nothing of x needs keeping
    ctx->saved_data["sin"] = sin;
    ctx->saved_data["interleave"] = interleave;
    return rotated(x, cos, sin, interleave, /*inverse=*/false);
  }

  // A rotation's gradient is the rotation by the opposite angle.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    return {rotated(grad_outputs[0], ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor(),
                    ctx->saved_data["interleave"].toBool(), /*inverse=*/true),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The kernel takes a CUDA tensor of a dtype it knows with unit stride in head_dim (≤ 256, even)
// and at most 65535 heads and batch rows (its grid), and the fp32 tables on the same GPU.
bool fused_kernel_applies(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t d = x.size(3);
  return cos.dim() == 2 && cuda::element_of(x) && x.stride(3) == 1 && d % 2 == 0 && d <= 256 && x.numel() > 0 &&
         x.size(0) <= 65535 && x.size(1) <= 65535 &&
         cos.device() == x.device() && sin.device() == x.device() && cos.scalar_type() == torch::kFloat32 &&
         sin.scalar_type() == torch::kFloat32 && cos.size(1) == d && cos.stride(1) == 1 &&
         sin.strides() == cos.strides();
}
#endif

}  // namespace

RopeTables make_rope_tables(int64_t max_seq_len, int64_t head_dim, double theta, bool interleave,
                            const YarnScaling& yarn) {
  auto f64 = torch::dtype(torch::kFloat64);
  torch::Tensor exponents = torch::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim);
  torch::Tensor inv_freq = torch::pow(theta, -exponents);                      // [d/2]
  double magnitude = 1.0;
  if (yarn.factor > 1) {
    const double low = std::max(0.0, std::floor(pair_turning(yarn.beta_fast, head_dim, theta, yarn.original_max_seq_len)));
    const double high = std::min(static_cast<double>(head_dim - 1),
                                 std::ceil(pair_turning(yarn.beta_slow, head_dim, theta, yarn.original_max_seq_len)));
    // 0 for the fast pairs (kept), 1 for the slow ones (interpolated).
    torch::Tensor ramp = ((torch::arange(head_dim / 2, f64) - low) / (high > low ? high - low : 0.001)).clamp(0, 1);
    inv_freq = inv_freq / yarn.factor * ramp + inv_freq * (1 - ramp);
    magnitude = yarn_mscale(yarn.factor, yarn.mscale) / yarn_mscale(yarn.factor, yarn.mscale_all_dim);
  }
  torch::Tensor angles = torch::outer(torch::arange(max_seq_len, f64), inv_freq);  // [S, d/2]
  torch::Tensor sin = angles.sin() * magnitude;
  torch::Tensor both = interleave ? angles.repeat_interleave(2, /*dim=*/1)
                                  : torch::cat({angles, angles}, /*dim=*/1);
  torch::Tensor signed_sin = interleave ? torch::stack({-sin, sin}, /*dim=*/-1).flatten(-2)
                                        : torch::cat({-sin, sin}, /*dim=*/1);
  // Angles in float64, tables in float32: long contexts keep their precision.
  return {(both.cos() * magnitude).to(torch::kFloat32), signed_sin.to(torch::kFloat32), interleave};
}

torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& tables) {
  const int64_t seq = x.size(2), d = x.size(3);
#ifdef DSTRAIN_WITH_CUDA_KERNELS
  if (tables.cuda_kernel && fused_kernel_applies(x, tables.cos, tables.sin))
    return FusedRope::apply(x, tables.cos.narrow(0, 0, seq), tables.sin.narrow(0, 0, seq), tables.interleave);
#endif
  const bool per_row = tables.cos.dim() == 4;  // rope_tables_at's: already x's positions
  torch::Tensor cos = (per_row ? tables.cos : tables.cos.narrow(0, 0, seq)).to(x.dtype());
  torch::Tensor sin = (per_row ? tables.sin : tables.sin.narrow(0, 0, seq)).to(x.dtype());
  // Each pair (a, b) → (b, a); the table's signs make it (-b, a).
  torch::Tensor swapped = tables.interleave ? x.unflatten(-1, {d / 2, 2}).flip(-1).flatten(-2)
                                            : torch::cat({x.narrow(-1, d / 2, d / 2), x.narrow(-1, 0, d / 2)}, -1);
  return torch::addcmul(x * cos, swapped, sin);
}

RopeTables rope_tables_from(const RopeTables& tables, int64_t first, int64_t count) {
  return {tables.cos.narrow(0, first, count), tables.sin.narrow(0, first, count), tables.interleave,
          tables.cuda_kernel};
}

RopeTables rope_tables_at(const RopeTables& tables, const torch::Tensor& positions) {
  const int64_t rows = positions.size(0), d = tables.cos.size(1);
  return {tables.cos.index_select(0, positions).view({rows, 1, 1, d}),
          tables.sin.index_select(0, positions).view({rows, 1, 1, d}), tables.interleave, tables.cuda_kernel};
}

}  // namespace dstrain
