// Context parallelism as the model sees it (Megatron-LM's and torchtitan's load-balanced ring
// attention): each sequence is cut into 2C chunks and rank i of a cp group of C holds chunks i and
// 2C − 1 − i, so that causal attention's work is the same on every rank. Everything but attention
// works on those tokens alone (at their global positions); attention computes its queries against
// the keys and values of every rank's chunks as they pass around the ring (C − 1 passes), merging
// the partial results by their log-sum-exp. What passes is what the keys and values are made from
// (`keys_values`): the keys and values themselves, or MLA's compressed latent and rope key, which
// each rank expands with its own kv_b_proj. The passes are differentiable: the backward pass sends
// the gradients of what passed back around the ring.
//
// The group is an interface handed in from outside (parallel/context_parallel_collectives.h over a
// communicator), so the model keeps no communicator of its own.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <functional>
#include <utility>

namespace dstrain {

class ContextParallelGroup {
 public:
  virtual ~ContextParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual void all_reduce_sum(torch::Tensor& tensor) = 0;
  // `tensor` to the next rank of the ring (rank + 1, the last to the first), the previous rank's
  // (of the same shape and dtype) returned; `backward`: to the previous, from the next.
  virtual torch::Tensor pass_on(const torch::Tensor& tensor, bool backward) = 0;
  // Bytes this rank has sent by pass_on so far.
  virtual int64_t bytes_passed() const = 0;
};

// The global chunk numbers rank `rank` of `size` holds, in the order its tokens hold them.
std::pair<int64_t, int64_t> context_chunks_of(int rank, int size);
// This rank's two chunks of a whole sequence `x` (split along `dim` into 2 × size chunks), joined.
torch::Tensor context_parallel_part(const torch::Tensor& x, const ContextParallelGroup& group, int64_t dim);

struct RingAttentionInputs {
  torch::Tensor query;   // [B, H, L, dq]: this rank's L = 2n positions (its two chunks)
  torch::Tensor passed;  // what goes around the ring, made on this rank from its own positions
  // The keys [B, H, L, dq] and values [B, H, L, dv] of a rank's two chunks from what it passed.
  std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor&)> keys_values;
  double scale = 1.0;
};

// Causal attention of this rank's queries over the whole sequence, [B, H, L, dv], computed in
// fp32 at least and returned in the query's dtype. `score_elements`, when given, counts the
// attention scores computed (the work).
torch::Tensor ring_attention(const RingAttentionInputs& inputs, ContextParallelGroup& group,
                             int64_t* score_elements = nullptr);

}  // namespace dstrain
