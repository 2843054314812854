#include "dstrain/model/rope.h"

namespace dstrain {

RopeTables make_rope_tables(int64_t max_seq_len, int64_t head_dim, double theta, bool interleave) {
  auto f64 = torch::dtype(torch::kFloat64);
  torch::Tensor exponents = torch::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim);
  torch::Tensor inv_freq = torch::pow(theta, -exponents);                      // [d/2]
  torch::Tensor angles = torch::outer(torch::arange(max_seq_len, f64), inv_freq);  // [S, d/2]
  torch::Tensor sin = angles.sin();
  torch::Tensor both = interleave ? angles.repeat_interleave(2, /*dim=*/1)
                                  : torch::cat({angles, angles}, /*dim=*/1);
  torch::Tensor signed_sin = interleave ? torch::stack({-sin, sin}, /*dim=*/-1).flatten(-2)
                                        : torch::cat({-sin, sin}, /*dim=*/1);
  // Angles in float64, tables in float32: long contexts keep their precision.
  return {both.cos().to(torch::kFloat32), signed_sin.to(torch::kFloat32), interleave};
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

}  // namespace dstrain
