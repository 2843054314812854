// The model's context-parallel group (model/context_parallel.h) over a communicator of the grid's
// cp group: sums by all-reduce, and the ring's passes as one exchange each (sends to the next
// rank and receives from the previous, posted together and under way until waited for).
#pragma once

#include "dstrain/model/context_parallel.h"
#include "dstrain/parallel/communicator.h"

namespace dstrain {

class ContextParallelCollectives : public ContextParallelGroup {
 public:
  explicit ContextParallelCollectives(Communicator& cp) : cp_(cp) {}
  int size() const override { return cp_.size(); }
  int rank() const override { return cp_.rank(); }
  void all_reduce_sum(torch::Tensor& tensor) override { cp_.all_reduce(tensor, ReduceOp::kSum); }
  std::unique_ptr<RingPassUnderWay> start_pass(const std::vector<torch::Tensor>& outgoing) override;
  int64_t bytes_passed() const override { return bytes_passed_; }

 private:
  Communicator& cp_;
  int64_t bytes_passed_ = 0;
};

}  // namespace dstrain
