// The fp32 gradients ("main gradients", as Megatron calls them) of one rank's parameters, in one
// flat buffer: micro-batches accumulate into it, the data-parallel group averages it, and the
// norm, clipping and the optimizer read it.
//
// fp32 parameters accumulate straight into it: their .grad is a view of the buffer, and autograd
// adds into an existing .grad in place. bf16/fp16 parameters get a fresh .grad from each backward
// pass, which is added in (and freed) as soon as autograd has made it, so that summing
// micro-batches never rounds to 16 bits; a step's first one is copied in, so that their part of
// the buffer needs no zeroing pass (one write and one read of 4 bytes a parameter less per step).
// Those that get no gradient in a step are zeroed before anything reads them.
//
// The buffer is laid out in the order in which the backward pass finishes the parameters (the
// reverse of their use) and averaged over the DP group in buckets of about `bucket_bytes`: with
// `overlap`, each bucket's reduction starts as soon as the step's last gradient of each of its
// parameters has arrived (a hook on each parameter's gradient accumulator), while the backward
// pass goes on, as PyTorch's DDP and Megatron do. MPI moves a nonblocking collective on only inside
// MPI calls, so each later arrival also asks the buckets under way whether they are done
// (Work::ready), which keeps them going while the backward pass computes.
//
// 8-bit gradients (`quantized`): each bucket, padded to dp whole chunks of quantization blocks,
// is averaged by quantized_reduction.h after the backward pass (not overlapped with it), with
// `error_feedback` carrying each rank's quantization error into its next step's gradient.
//
// ZeRO-1 (`shard`): each bucket is padded to a multiple of the DP size and reduce-scattered, so
// that DP rank r ends with the average of the r-th 1/dp of every bucket only: its shard. The
// optimizer updates just the parameters' elements in the shard (shards()), and
// gather_parameters() then all-gathers the updated parameters from their owners. Communication
// equals an all-reduce's; optimizer state falls to 1/dp per rank (Megatron's distributed optimizer).
#pragma once

#include "dstrain/core/torch_api.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dstrain/core/torch_compat.h"
#include "dstrain/parallel/communicator.h"
#include "dstrain/optim/block_quantization.h"
#include "dstrain/optim/parameter_shard.h"

namespace dstrain {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct GradientReduction {
  Communicator* group = nullptr;  // the copies to average over; nullptr or one rank: nothing to average
  torch::ScalarType wire_dtype = torch::kFloat32;  // bf16/fp16 halve the bytes on the wire
  int64_t bucket_bytes = int64_t{25} << 20;   // of fp32 gradients per bucket
  bool overlap = true;                        // start buckets during the backward pass
  int64_t microbatches = 1;                   // gradients each parameter receives per step
  bool shard = false;                         // ZeRO-1: reduce-scatter; each DP rank owns a shard
  // The sum over the group is divided by this; 0: by the group's size (an average). Expert
  // parallelism's experts sum the gradients of more ranks' tokens than their group has members.
  int64_t divide_sum_by = 0;
  std::optional<BlockFormat> quantized;  // 8-bit values on the wire instead of wire_dtype
  bool error_feedback = false;           // quantized: carry each rank's error to its next step
};

// What a step's data-parallel reduction cost, summed over the steps so far. Times by host clocks
// (the MPI backend's; NCCL's work runs on its own stream and is not seen here); bytes as this
// rank hands them to the collectives (an all-reduce counted as a ring's reduce-scatter and
// all-gather, 2 (dp - 1) / dp of the buffer).
struct CommunicationRecord {
  double exposed_s = 0;    // from the end of the backward pass until the last bucket was complete
  double in_flight_s = 0;  // with a bucket under way, from its start until it was seen complete
  int64_t bytes_sent = 0;
  int64_t steps = 0;
};

class GradientBuffer {
 public:
  // `params` by global name: grads() follows their order. `use_order`: the same tensors in the
  // order the forward pass uses them.
  GradientBuffer(const NamedTensors& params, const std::vector<torch::Tensor>& use_order,
                 GradientReduction reduction = {});
  ~GradientBuffer();
  GradientBuffer(const GradientBuffer&) = delete;
  GradientBuffer& operator=(const GradientBuffer&) = delete;

  void zero();    // before a step's first backward pass
  // The gradients each parameter receives per step from now on (a batch-size ramp-up changes them).
  void set_microbatches(int64_t microbatches) { reduction_.microbatches = microbatches; }
  // After its last, always: the average over the DP group, complete (without one, the sum as
  // it is); sharded, only this rank's shard of the buffer holds it.
  void reduce();

  torch::Tensor& flat() { return flat_; }
  // One fp32 view of the buffer per parameter, in the order of `params`, with its shape.
  const std::vector<torch::Tensor>& grads() const { return views_; }
  size_t buckets() const { return buckets_.size(); }
  // Nothing is measured without a group to average over.
  const CommunicationRecord& communication() const { return record_; }
  // Quantized with error feedback: this rank's carried quantization error, one value per element
  // of flat() (checkpointed, so that a resumed run goes on with it); else undefined.
  torch::Tensor& error_feedback() { return residual_; }

  bool sharded() const { return sharded_; }
  // The DP ranks holding the other shards (sharded only; else nullptr).
  Communicator* shard_group() const { return sharded_ ? reduction_.group : nullptr; }
  // What this rank's optimizer updates, in the order of `params`: every parameter whole, or
  // sharded the pieces of those that fall in this rank's shard.
  const std::vector<ParameterShard>& shards() const { return shards_; }
  std::vector<torch::Tensor> shard_grads() const;
  // The parts of the buffer whose average this rank holds after reduce(): all of it, or its shard.
  std::vector<torch::Tensor> owned_regions() const;
  // Sharded: every rank receives the updated pieces of the others (collective over the DP group).
  void gather_parameters();

 private:
  struct Slot {                 // a parameter, in buffer order
    torch::Tensor param, view;
    int64_t offset;             // of view in flat_
    bool added_in;              // bf16/fp16: its .grad is added to the view by the hook
    size_t bucket;
    int64_t arrivals = 0;       // gradients received this step
    bool written = false;       // added in: the view holds this step's gradient (else stale)
  };
  struct Bucket {
    int64_t start = 0, length = 0;  // elements of flat_ (sharded: a multiple of the DP size)
    size_t first_slot = 0, slots = 0, ready = 0;
    torch::Tensor wire;             // what travels (flat_'s range, or a 16-bit copy)
    torch::Tensor shard;            // sharded: this rank's averaged part of it
    std::unique_ptr<Work> work;
    std::chrono::steady_clock::time_point started, completed;  // this step's; completed: when seen
  };
  friend class GradientArrivalHook;
  void on_gradient(size_t slot);  // after the parameter's gradient accumulator has run
  void launch(Bucket& bucket);
  void reduce_quantized(Bucket& bucket);
  void poll_started();  // notes the buckets under way that have completed, in order
  void record_times(std::chrono::steady_clock::time_point backward_end);
  void apply_divisor();  // divide_sum_by, where it is not the group's size
  void zero_unwritten(const Bucket& bucket);  // added-in views that got no gradient this step
  int64_t shard_length(const Bucket& bucket) const { return bucket.length / reduction_.group->size(); }
  int64_t shard_start(const Bucket& bucket) const {
    return bucket.start + reduction_.group->rank() * shard_length(bucket);
  }

  GradientReduction reduction_;
  bool sharded_ = false;
  torch::Tensor flat_;
  std::vector<torch::Tensor> views_;  // in the order of `params`
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<ParameterShard> shards_;
  struct ShardPlace {
    size_t bucket;
    int64_t flat_offset;
  };
  std::vector<ShardPlace> shard_places_;  // where each of shards_ lies in the buffer
  size_t next_launch_ = 0;    // buckets before it have started this step
  size_t next_complete_ = 0;  // buckets before it were seen complete this step
  CommunicationRecord record_;
  torch::Tensor residual_;  // see error_feedback()
  std::vector<compat::GradAccumulatorPtr> accumulators_;  // the autograd nodes the hooks live on
  std::mutex mutex_;                                 // hooks may run on autograd's threads
  std::thread::id owner_;
};

}  // namespace dstrain
