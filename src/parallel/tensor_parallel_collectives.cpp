#include "dstrain/parallel/tensor_parallel_collectives.h"

#include <stdexcept>
#include <string>

namespace dstrain {

torch::Tensor TensorParallelCollectives::all_gather(const torch::Tensor& tensor, int64_t dim) {
  const torch::Tensor first = tensor.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = first.sizes().vec();
  shape[0] *= tp_.size();
  torch::Tensor gathered = torch::empty(shape, first.options());
  tp_.all_gather(gathered, first);
  // Contiguous in the caller's layout: the products that take it (q, k and v; gate and up) would
  // each copy a strided view to multiply it, and keep their copies for the backward pass.
  return dim == 0 ? gathered : gathered.movedim(0, dim).contiguous();
}

torch::Tensor TensorParallelCollectives::reduce_scatter(const torch::Tensor& tensor, int64_t dim) {
  if (tensor.size(dim) % tp_.size() != 0)
    throw std::invalid_argument("reduce_scatter: dimension " + std::to_string(dim) + " (" +
                                std::to_string(tensor.size(dim)) + ") does not split into " +
                                std::to_string(tp_.size()) + " equal chunks");
  const torch::Tensor first = tensor.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = first.sizes().vec();
  shape[0] /= tp_.size();
  torch::Tensor chunk = torch::empty(shape, first.options());
  tp_.reduce_scatter(chunk, first, ReduceOp::kSum);
  return dim == 0 ? chunk : chunk.movedim(0, dim).contiguous();
}

}  // namespace dstrain
