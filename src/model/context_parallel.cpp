#include "dstrain/model/context_parallel.h"

#include <stdexcept>
#include <string>

namespace dstrain {

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

}  // namespace dstrain
