// The fp32 gradients ("main gradients", as Megatron calls them) of one rank's parameters, in one
// flat buffer: micro-batches accumulate into it, the data-parallel group averages it, and the
// norm, clipping and the optimizer read it.
//
// fp32 parameters accumulate straight into it: their .grad is a view of the buffer, and autograd
// adds into an existing .grad in place. bf16/fp16 parameters get a fresh .grad from each backward
// pass, which is added in (and freed) as soon as autograd has made it, so that summing
// micro-batches never rounds to 16 bits.
//
// The buffer is laid out in the order in which the backward pass finishes the parameters (the
// reverse of their use) and averaged over the DP group in buckets of about `bucket_bytes`: with
// `overlap`, each bucket's all-reduce starts as soon as the step's last gradient of each of its
// parameters has arrived (a hook on each parameter's gradient accumulator), while the backward
// pass goes on, as PyTorch's DDP and Megatron do.
#pragma once

#include "dstrain/core/torch_api.h"

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dstrain/dist/communicator.h"

namespace dstrain {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct GradientReduction {
  Communicator* dp_group = nullptr;           // nullptr or one rank: nothing to average
  torch::ScalarType wire_dtype = torch::kFloat32;  // bf16/fp16 halve the bytes on the wire
  int64_t bucket_bytes = int64_t{25} << 20;   // of fp32 gradients per bucket
  bool overlap = true;                        // start buckets during the backward pass
  int64_t microbatches = 1;                   // gradients each parameter receives per step
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
  void reduce();  // after its last: the average over the DP group, complete (no-op without one)

  torch::Tensor& flat() { return flat_; }
  // One fp32 view of the buffer per parameter, in the order of `params`, with its shape.
  const std::vector<torch::Tensor>& grads() const { return views_; }
  size_t buckets() const { return buckets_.size(); }

 private:
  struct Slot {                 // a parameter, in buffer order
    torch::Tensor param, view;
    bool added_in;              // bf16/fp16: its .grad is added to the view by the hook
    size_t bucket;
    int64_t arrivals = 0;       // gradients received this step
  };
  struct Bucket {
    int64_t start = 0, length = 0;  // elements of flat_
    size_t slots = 0, ready = 0;
    torch::Tensor wire;             // what travels (flat_'s range, or a 16-bit copy)
    std::unique_ptr<Work> work;
  };
  friend class GradientArrivalHook;
  void on_gradient(size_t slot);  // after the parameter's gradient accumulator has run
  void launch(Bucket& bucket);

  GradientReduction reduction_;
  torch::Tensor flat_;
  std::vector<torch::Tensor> views_;  // in the order of `params`
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;  // buckets before it have started this step
  std::vector<std::shared_ptr<void>> accumulators_;  // the autograd nodes the hooks live on
  std::mutex mutex_;                                 // hooks may run on autograd's threads
  std::thread::id owner_;
};

}  // namespace dstrain
