// Tensor parallelism as the model sees it (Megatron-LM's tensor_parallel/mappings.py and
// cross_entropy.py): the collectives of a layer split over the ranks of its tensor-parallel group,
// each as a differentiable operation whose backward pass is the matching collective.
//
//   copy_to_tensor_parallel        forward: x as it is        backward: the group's gradients summed
//   reduce_from_tensor_parallel    forward: the group's sum   backward: the gradient as it is
//       (a column-parallel product between them computes a slice of the output features, a
//        row-parallel one a partial sum of the output: attention by heads, MLPs by FFN width)
//   gather_from_sequence_parallel  forward: all-gather along the sequence    backward: reduce-scatter
//   scatter_to_sequence_parallel   forward: reduce-scatter along the sequence backward: all-gather
//       (sequence parallelism: the all-reduces above become these pairs, and norms and residuals
//        hold 1/T of the sequence)
//   gather_sequence_whole          forward: all-gather along the sequence    backward: this rank's part
//       (from sequence parallelism into layers every rank computes on the whole sequence:
//        multi-token prediction's, whose shorter sequences need not split evenly)
//   vocab_parallel_cross_entropy   the next-token loss of logits split by vocabulary, from each
//                                  shard's max and sum of exponentials: the full logits never meet
//
// The group is an interface handed in from outside (parallel/tensor_parallel_collectives.h over a
// communicator), so the model keeps no communicator of its own.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <memory>

namespace dstrain {

// A collective of TensorParallelGroup under way; its result once complete.
class TensorParallelWork {
 public:
  virtual ~TensorParallelWork() = default;
  virtual torch::Tensor wait() = 0;
};

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // In place: every rank ends with the sum (max) over the group.
  virtual void all_reduce_sum(torch::Tensor& tensor) = 0;
  virtual void all_reduce_max(torch::Tensor& tensor) = 0;
  // The group's tensors (of one shape) concatenated along `dim`, in rank order.
  virtual torch::Tensor all_gather(const torch::Tensor& tensor, int64_t dim) = 0;
  // The sum over the group of `tensor`, split into size() equal chunks along `dim`: this rank's chunk.
  virtual torch::Tensor reduce_scatter(const torch::Tensor& tensor, int64_t dim) = 0;
  // The same collectives (the sum into a new tensor), started and returned at once, so that the
  // caller computes while they run; `tensor` stays untouched until wait().
  virtual std::unique_ptr<TensorParallelWork> all_reduce_sum_async(const torch::Tensor& tensor) = 0;
  virtual std::unique_ptr<TensorParallelWork> all_gather_async(const torch::Tensor& tensor, int64_t dim) = 0;
  virtual std::unique_ptr<TensorParallelWork> reduce_scatter_async(const torch::Tensor& tensor, int64_t dim) = 0;
};

// n / T for a layer dimension split over `group` (n itself without one); throws
// std::invalid_argument naming `what` when T does not divide it.
int64_t split_by_tensor_parallel(int64_t n, const TensorParallelGroup* group, const char* what);

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, TensorParallelGroup& group);
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, TensorParallelGroup& group);
torch::Tensor gather_from_sequence_parallel(const torch::Tensor& x, TensorParallelGroup& group, int64_t dim);
torch::Tensor scatter_to_sequence_parallel(const torch::Tensor& x, TensorParallelGroup& group, int64_t dim);
torch::Tensor gather_sequence_whole(const torch::Tensor& x, TensorParallelGroup& group, int64_t dim);

// Where a split layer's input enters its ranks and its output leaves them: with sequence
// parallelism an all-gather of the sequence and a reduce-scatter (along dim 1 of [B, S, H], along
// the rows of [tokens, H]), without it a copy and a sum; nothing without a group.
struct TensorParallelRegion {
  TensorParallelGroup* group = nullptr;
  bool sequence_parallel = false;

  explicit operator bool() const { return group != nullptr; }
  torch::Tensor enter(const torch::Tensor& x) const;
  torch::Tensor leave(const torch::Tensor& x) const;
  // Where the tokens lie in what enters and leaves: dim 1 of [B, S, H], dim 0 of [tokens, H].
  static int64_t token_dim(const torch::Tensor& x) { return x.dim() == 3 ? 1 : 0; }
};

// The mean next-token loss of `logits` [N, V / T] (this rank's vocabulary shard: ids rank × V / T
// ... (rank + 1) × V / T - 1) for `targets` [N] (global ids, the same on every rank of the group),
// positions whose target is `ignore_index` left out (a mean over none is 0). Computed in fp32 at
// least; every rank gets the loss, and the gradient of its own shard.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           TensorParallelGroup& group, int64_t ignore_index = -100);

}  // namespace dstrain
