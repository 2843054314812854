// The model's tensor-parallel group (model/tensor_parallel.h) over a communicator of the grid's tp
// group: sums and maxima by all-reduce, and all-gathers and reduce-scatters along any dimension
// (the communicator's run along the first; the others are moved there and back).
#pragma once

#include "dstrain/model/tensor_parallel.h"
#include "dstrain/parallel/communicator.h"

namespace dstrain {

class TensorParallelCollectives : public TensorParallelGroup {
 public:
  explicit TensorParallelCollectives(Communicator& tp) : tp_(tp) {}
  int size() const override { return tp_.size(); }
  int rank() const override { return tp_.rank(); }
  void all_reduce_sum(torch::Tensor& tensor) override { tp_.all_reduce(tensor, ReduceOp::kSum); }
  void all_reduce_max(torch::Tensor& tensor) override { tp_.all_reduce(tensor, ReduceOp::kMax); }
  torch::Tensor all_gather(const torch::Tensor& tensor, int64_t dim) override {
    return all_gather_async(tensor, dim)->wait();
  }
  torch::Tensor reduce_scatter(const torch::Tensor& tensor, int64_t dim) override {
    return reduce_scatter_async(tensor, dim)->wait();
  }
  std::unique_ptr<TensorParallelWork> all_reduce_sum_async(const torch::Tensor& tensor) override;
  std::unique_ptr<TensorParallelWork> all_gather_async(const torch::Tensor& tensor, int64_t dim) override;
  std::unique_ptr<TensorParallelWork> reduce_scatter_async(const torch::Tensor& tensor, int64_t dim) override;

 private:
  Communicator& tp_;
};

}  // namespace dstrain
