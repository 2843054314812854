#include "dstrain/parallel/tensor_parallel_collectives.h"

#include <stdexcept>
#include <string>

namespace dstrain {
namespace {

// A communicator's operation under way along dim 0 of `result`, which wait() returns with `dim`
// moved back where the caller had it.
class MovedBack final : public TensorParallelWork {
 public:
  MovedBack(std::unique_ptr<Work> work, torch::Tensor input, torch::Tensor result, int64_t dim)
      : work_(std::move(work)), input_(std::move(input)), result_(std::move(result)), dim_(dim) {}
  torch::Tensor wait() override {
    work_->wait();
    // Contiguous in the caller's layout: the products that take a gathered input (q, k and v;
    // gate and up) would each copy a strided view to multiply it, and keep their copies.
    return dim_ == 0 ? result_ : result_.movedim(0, dim_).contiguous();
  }

 private:
  std::unique_ptr<Work> work_;
  torch::Tensor input_, result_;  // both kept until the operation completes
  int64_t dim_;
};

}  // namespace

std::unique_ptr<TensorParallelWork> TensorParallelCollectives::all_reduce_sum_async(const torch::Tensor& tensor) {
  torch::Tensor sum = tensor.contiguous().clone();
  auto work = tp_.all_reduce_async(sum, ReduceOp::kSum);
  return std::make_unique<MovedBack>(std::move(work), torch::Tensor(), sum, 0);
}

std::unique_ptr<TensorParallelWork> TensorParallelCollectives::all_gather_async(const torch::Tensor& tensor,
                                                                               int64_t dim) {
  torch::Tensor first = tensor.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = first.sizes().vec();
  shape[0] *= tp_.size();
  torch::Tensor gathered = torch::empty(shape, first.options());
  auto work = tp_.all_gather_async(gathered, first);
  return std::make_unique<MovedBack>(std::move(work), first, gathered, dim);
}

std::unique_ptr<TensorParallelWork> TensorParallelCollectives::reduce_scatter_async(const torch::Tensor& tensor,
                                                                                   int64_t dim) {
  if (tensor.size(dim) % tp_.size() != 0)
    throw std::invalid_argument("reduce_scatter: dimension " + std::to_string(dim) + " (" +
                                std::to_string(tensor.size(dim)) + ") does not split into " +
                                std::to_string(tp_.size()) + " equal chunks");
  torch::Tensor first = tensor.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = first.sizes().vec();
  shape[0] /= tp_.size();
  torch::Tensor chunk = torch::empty(shape, first.options());
  auto work = tp_.reduce_scatter_async(chunk, first, ReduceOp::kSum);
  return std::make_unique<MovedBack>(std::move(work), first, chunk, dim);
}

}  // namespace dstrain
