#include "dstrain/model/context_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace dstrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor summed(const torch::Tensor& x, ContextParallelGroup& group) {
  torch::Tensor sum = x.contiguous().clone();
  group.all_reduce_sum(sum);
  return sum;
}

// The sum over the group on every rank; its gradient is likewise the sum of every rank's.
class SumOverContextParallel : public torch::autograd::Function<SumOverContextParallel> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, ContextParallelGroup* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return summed(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<ContextParallelGroup*>(ctx->saved_data["group"].toInt());
    return {summed(grads[0], *group), torch::Tensor()};
  }
};

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

int64_t context_parallel_tail(const ContextParallelGroup& group, int64_t count) {
  return context_chunks_of(group.rank(), group.size()).second == 2 * group.size() - 1 ? count : 0;
}

torch::Tensor context_parallel_ahead(const torch::Tensor& x, int64_t ahead, ContextParallelGroup& group) {
  const int64_t n = x.size(1) / 2, chunks = 2 * group.size();
  if (ahead < 0 || ahead > n)
    throw std::invalid_argument("context parallelism: " + std::to_string(ahead) +
                                " positions ahead pass beyond the next chunk of " + std::to_string(n));
  if (ahead == 0) return x;
  const auto [first, second] = context_chunks_of(group.rank(), group.size());
  const torch::Tensor none = torch::zeros_like(x.narrow(1, 0, ahead));
  std::vector<torch::Tensor> heads(static_cast<size_t>(chunks), none);
  heads[static_cast<size_t>(first)] = x.narrow(1, 0, ahead);
  heads[static_cast<size_t>(second)] = x.narrow(1, n, ahead);
  const torch::Tensor every_head = SumOverContextParallel::apply(torch::stack(heads), &group);
  auto continued = [&](int64_t chunk, int64_t start) {
    const torch::Tensor next = chunk + 1 < chunks ? every_head[chunk + 1] : none;
    return torch::cat({x.narrow(1, start + ahead, n - ahead), next}, 1);
  };
  return torch::cat({continued(first, 0), continued(second, n)}, 1);
}

}  // namespace dstrain
