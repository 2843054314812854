#include "dstrain/model/causal_attention.h"

#include "dstrain/core/torch_compat.h"
#include "dstrain/model/recompute.h"

namespace dstrain {

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                               SelectiveRecompute selective) {
  if (compat::kHasFusedAttention || !selective.on) return compat::causal_attention(q, k, v, scale);
  auto probabilities = [scale](const Tensors& qk) {
    return Tensors{compat::causal_attention_probabilities(qk[0], qk[1], scale)};
  };
  auto times_values = [&v](const Tensors& probs) { return Tensors{torch::matmul(probs[0], v)}; };
  return recompute_outputs(probabilities, {q, k}, times_values, selective.clock)[0];
}

}  // namespace dstrain
