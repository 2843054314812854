#include "dstrain/model/rope.h"

#include <algorithm>
#include <cmath>

namespace dstrain {

namespace {

double yarn_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

// The pair index whose rotation count over `length` positions is `rotations` (YaRN's correction
// dimension), for a head of dimension d.
double pair_turning(double rotations, int64_t d, double theta, int64_t length) {
  return static_cast<double>(d) * std::log(static_cast<double>(length) / (rotations * 2 * M_PI)) / (2 * std::log(theta));
}

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
  torch::Tensor cos = tables.cos.narrow(0, 0, seq).to(x.dtype());
  torch::Tensor sin = tables.sin.narrow(0, 0, seq).to(x.dtype());
  // Each pair (a, b) → (b, a); the table's signs make it (-b, a).
  torch::Tensor swapped = tables.interleave ? x.unflatten(-1, {d / 2, 2}).flip(-1).flatten(-2)
                                            : torch::cat({x.narrow(-1, d / 2, d / 2), x.narrow(-1, 0, d / 2)}, -1);
  return torch::addcmul(x * cos, swapped, sin);
}

RopeTables rope_tables_from(const RopeTables& tables, int64_t first, int64_t count) {
  return {tables.cos.narrow(0, first, count), tables.sin.narrow(0, first, count), tables.interleave};
}

}  // namespace dstrain
