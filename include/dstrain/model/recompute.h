// Activation recomputation (train.recompute): a part of the forward pass that keeps only its input
// and reruns itself inside the backward pass, trading compute for activation memory (Megatron's
// full and selective recomputation; PyTorch's reentrant checkpoint). LibTorch's C++ API has no
// such utility: recompute_in_backward and recompute_outputs are the autograd functions that do it.
//
// full: each decoder layer keeps only its input (recompute_in_backward around the layer), the
// multi-token prediction modules' layers too.
// selective: DeepSeek-V3's choice, the cheap operations whose outputs are large: the RMSNorms
// before attention and MLP, MLA's up-projections (with the latents' norms and the rotary
// embedding) and the SwiGLU activation of every MLP and expert, in the multi-token prediction
// modules' layers too; and unfused attention's probabilities (causal_attention.h). Their outputs
// are dropped as soon as the operation that uses them has run and computed again just before its
// backward pass (recompute_outputs), so the backward pass runs as without recomputation, plus
// those reruns.
//
// The rerun computes bitwise what the first pass computed (the same operations on the same
// values, on any device dstrain runs deterministically), so training gives the same numbers with
// or without it. Work that must happen once per forward pass (MoE's expert-load counts) is told
// which pass it is in (Pass) and skips the rerun.
#pragma once

#include "dstrain/core/torch_api.h"

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "dstrain/core/config.h"

namespace dstrain {

// none: every activation kept; selective and full: see above.
enum class Recompute { kNone, kSelective, kFull };
// train.recompute's names: none, selective, full.
const EnumNames<Recompute>& recompute_names();

struct RecomputePlan {
  Recompute mode = Recompute::kNone;
  int64_t layers = 0;  // full: the first `layers` decoder layers of each model chunk; 0: all
  // Whether the decoder layer at `index` of a chunk reruns (the multi-token prediction modules'
  // layers count after the chunk's last).
  bool reruns_layer(int64_t index) const { return mode == Recompute::kFull && (layers == 0 || index < layers); }
};

// The host seconds spent on the reruns in backward passes (each part's forward pass again, and the
// copies into the outputs given back): the time recomputation costs on the CPU, measured inside the
// steps it slows. On a GPU it is only the time to queue the reruns' kernels. A rerun inside
// another counts once. One clock serves the parts of one rank, whose backward passes run one at a
// time (a side lane's forward passes rerun nothing).
class RerunClock {
 public:
  double seconds() const { return static_cast<double>(nanoseconds_.load()) * 1e-9; }
  int64_t reruns() const { return reruns_.load(); }  // those counted: a rerun inside another is part of it

 private:
  friend class Rerun;
  std::atomic<int64_t> nanoseconds_{0}, reruns_{0};
  std::atomic<int> depth_{0};  // reruns under way (they nest)
};

// Which forward pass of a part runs: the first, or its rerun inside the backward pass.
enum class Pass { kFirst, kRerun };
using RerunnablePart = std::function<torch::Tensor(const torch::Tensor&, Pass)>;

// `part(input, kFirst)` without keeping its intermediate tensors: the backward pass reruns it as
// part(input, kRerun) on the kept `input` with gradients on and back-propagates through the rerun
// (into its parameters, whose gradients accumulate as usual, and into `input`). Without gradients
// (evaluation), or when `input` needs none (its parameters would get none through the rerun), just
// part(input, kFirst). `clock` (may be nullptr) counts the rerun.
torch::Tensor recompute_in_backward(const RerunnablePart& part, const torch::Tensor& input,
                                    RerunClock* clock = nullptr);

using Tensors = std::vector<torch::Tensor>;
using TensorsFunction = std::function<Tensors(const Tensors&)>;

// consumer(part(inputs)), keeping part's outputs only while consumer runs: their memory is given
// back then, and refilled by rerunning part on its kept inputs just before consumer's backward
// pass needs them (Megatron-Core's checkpoint without output). The gradients are bitwise those
// without it. part's outputs must serve consumer alone. Without gradients, or when no input
// needs one, just consumer(part(inputs)). `clock` (may be nullptr) counts the rerun.
Tensors recompute_outputs(const TensorsFunction& part, const Tensors& inputs, const TensorsFunction& consumer,
                          RerunClock* clock = nullptr);

// What a module needs of train.recompute = selective: whether it drops the outputs it can rerun
// cheaply (recompute_outputs), and the clock the reruns count on.
struct SelectiveRecompute {
  bool on = false;
  RerunClock* clock = nullptr;
};

}  // namespace dstrain
