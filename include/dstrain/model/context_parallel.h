// Context parallelism as the model sees it (Megatron-LM's and torchtitan's load-balanced ring
// attention): each sequence is cut into 2C chunks and rank i of a cp group of C holds chunks i and
// 2C − 1 − i, so that causal attention's work is the same on every rank. Everything but attention
// works on those tokens alone (at their global positions); attention computes its queries against
// the keys and values of every rank's chunks as they pass around the ring (C − 1 passes, each
// under way while the rank attends to what it holds), merging the partial results by their
// log-sum-exp. What passes is what the keys and values are made from (`keys_values`): the keys
// and values themselves, or MLA's compressed latent and rope key, which each rank expands with its
// own kv_b_proj.
//
// Ring attention keeps for its backward pass only its queries, what it passed, its output and the
// log-sum-exp of each query's scores (as flash attention does), not the scores of every pair of
// chunks nor the expanded keys and values of every rank: the backward pass sends what was passed
// around the ring once more, expands it again and recomputes each pair's probabilities, and the
// gradient of what each rank passed travels with it, gathering every rank's share, until it
// arrives back at its owner.
//
// The group is an interface handed in from outside (parallel/context_parallel_collectives.h over a
// communicator), so the model keeps no communicator of its own.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace dstrain {

// A pass around the ring under way (ContextParallelGroup::start_pass).
class RingPassUnderWay {
 public:
  virtual ~RingPassUnderWay() = default;
  // What the previous rank passed, in its order, once it has arrived.
  virtual std::vector<torch::Tensor> wait() = 0;
};

class ContextParallelGroup {
 public:
  virtual ~ContextParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual void all_reduce_sum(torch::Tensor& tensor) = 0;
  // Starts sending `outgoing` to the next rank of the ring (rank + 1, the last to the first) and
  // receiving the previous rank's tensors (of the same shapes and dtypes), and returns at once.
  virtual std::unique_ptr<RingPassUnderWay> start_pass(const std::vector<torch::Tensor>& outgoing) = 0;
  // Bytes this rank has sent around the ring so far.
  virtual int64_t bytes_passed() const = 0;
};

// The global chunk numbers rank `rank` of `size` holds, in the order its tokens hold them.
std::pair<int64_t, int64_t> context_chunks_of(int rank, int size);
// This rank's two chunks of a whole sequence `x` (split along `dim` into 2 × size chunks), joined.
torch::Tensor context_parallel_part(const torch::Tensor& x, const ContextParallelGroup& group, int64_t dim);

// Of the last `count` positions of the whole sequence, how many this rank holds: all of them on
// the rank holding the last chunk (they close its second chunk, so they are its last positions),
// none elsewhere. `count` must not exceed a chunk's length.
int64_t context_parallel_tail(const ContextParallelGroup& group, int64_t count);
// This rank's positions `ahead` places further on: x [B, L, ...] holds this rank's two chunks
// (n = L / 2 positions each), and the result's row of position p is x's row of position p + ahead,
// taken from the next chunk's first rows where it passes a chunk's end (whichever rank holds it:
// every chunk's first `ahead` rows are summed over the group, a collective), zero past the whole
// sequence's end. Differentiable: each row's gradient returns to the rank that holds it. (What
// multi-token prediction reads: the embedding of the token `ahead` places on.) ahead ≤ n.
torch::Tensor context_parallel_ahead(const torch::Tensor& x, int64_t ahead, ContextParallelGroup& group);

constexpr int64_t kRingScoreBlockElements = int64_t{1} << 24;  // 64 MiB of fp32 scores

struct RingAttentionInputs {
  torch::Tensor query;   // [B, H, L, dq]: this rank's L = 2n positions (its two chunks)
  torch::Tensor passed;  // what goes around the ring, made on this rank from its own positions
  // The keys [B, H, L, dq] and values [B, H, L, dv] of a rank's two chunks from what it passed.
  std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor&)> keys_values;
  // The parameters keys_values computes with (MLA's kv_b_proj): their gradients come from every
  // rank's keys and values expanded here.
  std::vector<torch::Tensor> expansion_parameters;
  double scale = 1.0;
  // The most attention scores computed at once (a block of queries against a chunk of keys): what
  // bounds a step's transient memory, whatever the chunks' length.
  int64_t score_block_elements = kRingScoreBlockElements;
};

// Causal attention of this rank's queries over the whole sequence, [B, H, L, dv], computed in
// fp32 at least and returned in the query's dtype; differentiable in the query, what was passed
// and the expansion parameters. `score_elements`, when given, counts the attention scores the
// forward pass computed (the work).
torch::Tensor ring_attention(const RingAttentionInputs& inputs, ContextParallelGroup& group,
                             int64_t* score_elements = nullptr);

}  // namespace dstrain
