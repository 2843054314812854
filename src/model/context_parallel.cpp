#include "dstrain/model/context_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <limits>
#include <stdexcept>
#include <string>

namespace dstrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One pass around the ring, differentiable: the gradient goes back the other way.
class RingPass : public torch::autograd::Function<RingPass> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, ContextParallelGroup* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return group->pass_on(x.contiguous(), /*backward=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<ContextParallelGroup*>(ctx->saved_data["group"].toInt());
    return {group->pass_on(grads[0].contiguous(), /*backward=*/true), torch::Tensor()};
  }
};

// A query chunk's attention so far: the output normalised over the keys seen, and the log of
// their softmax denominator.
struct Partial {
  torch::Tensor out, lse;  // [B, H, n, dv], [B, H, n]
};

Partial attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale, bool causal) {
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    const int64_t n = q.size(-2);
    const torch::Tensor future = torch::ones({n, n}, torch::dtype(torch::kBool).device(q.device())).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  }
  const torch::Tensor lse = scores.logsumexp(-1);
  return {torch::matmul((scores - lse.unsqueeze(-1)).exp(), v), lse};
}

// The log-sum-exp rule: both parts weighted by their share of the joint denominator.
Partial merge(const Partial& a, const Partial& b) {
  if (!a.out.defined()) return b;
  const torch::Tensor lse = torch::logaddexp(a.lse, b.lse);
  return {a.out * (a.lse - lse).exp().unsqueeze(-1) + b.out * (b.lse - lse).exp().unsqueeze(-1), lse};
}

}  // namespace

std::pair<int64_t, int64_t> context_chunks_of(int rank, int size) { return {rank, 2 * size - 1 - rank}; }

torch::Tensor context_parallel_part(const torch::Tensor& x, const ContextParallelGroup& group, int64_t dim) {
  const int64_t chunks = 2 * group.size(), length = x.size(dim);
  if (length % chunks != 0)
    throw std::invalid_argument("context parallelism over " + std::to_string(group.size()) + " ranks: a sequence of " +
                                std::to_string(length) + " does not split into " + std::to_string(chunks) + " chunks");
  const int64_t n = length / chunks;
  const auto [first, second] = context_chunks_of(group.rank(), group.size());
  return torch::cat({x.narrow(dim, first * n, n), x.narrow(dim, second * n, n)}, dim);
}

torch::Tensor ring_attention(const RingAttentionInputs& in, ContextParallelGroup& group, int64_t* score_elements) {
  const int size = group.size(), rank = group.rank();
  const auto compute = in.query.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const torch::Tensor q = in.query.to(compute);
  const int64_t n = q.size(2) / 2;
  const auto mine = context_chunks_of(rank, size);
  const std::array<int64_t, 2> query_chunks = {mine.first, mine.second};
  std::array<Partial, 2> partial;
  torch::Tensor passed = in.passed;
  for (int step = 0; step < size; ++step) {
    // Step s brings the chunks of rank − s: first this rank's own, where each query sees itself.
    const auto theirs = context_chunks_of((rank - step + size) % size, size);
    const std::array<int64_t, 2> key_chunks = {theirs.first, theirs.second};
    auto [k, v] = in.keys_values(passed);
    k = k.to(compute);
    v = v.to(compute);
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        if (query_chunks[a] < key_chunks[b]) continue;  // wholly in the future
        partial[a] = merge(partial[a], attend(q.narrow(2, a * n, n), k.narrow(2, b * n, n), v.narrow(2, b * n, n),
                                              in.scale, query_chunks[a] == key_chunks[b]));
        if (score_elements) *score_elements += q.size(0) * q.size(1) * n * n;
      }
    if (step + 1 < size) passed = RingPass::apply(passed, &group);
  }
  return torch::cat({partial[0].out, partial[1].out}, 2).to(in.query.scalar_type());
}

}  // namespace dstrain
