// A rank's gradients, one GradientBuffer per set of ranks that hold the same copy of its
// parameters. Every parameter is held by the whole data-parallel group, except, under expert
// parallelism, the routed experts: each is held by the dp / ep ranks of its expert-data group, and
// receives in each of them the gradients of the tokens of a whole expert-parallel group (ep data
// shards). Their sum over the expert-data group therefore covers every data shard once, and is
// divided by dp, as the others' average is. The global norm counts every parameter once.
#pragma once

#include <memory>
#include <vector>

#include "dstrain/parallel/parallel_context.h"
#include "dstrain/optim/grad_buffer.h"

namespace dstrain {

class ModelGradients {
 public:
  // `params` by global name, `use_order` as GradientBuffer takes them; `reduction`'s group is
  // ignored: the data-parallel group, and the expert-data group for routed experts.
  ModelGradients(const NamedTensors& params, const std::vector<torch::Tensor>& use_order,
                 GradientReduction reduction, ParallelContext& parallel);

  void zero();
  void set_microbatches(int64_t microbatches);  // per step, as GradientBuffer's
  void reduce();
  // The L2 norm of every gradient of the model, each parameter counted once (every stage's).
  torch::Tensor global_norm();

  // What the optimizer updates and their gradients: the replicated parameters', then the experts'.
  std::vector<ParameterShard> shards() const;
  std::vector<torch::Tensor> shard_grads() const;
  void gather_parameters();  // ZeRO-1: the updated shards to every holder

  // The data-parallel reductions' time and bytes so far, of every buffer.
  CommunicationRecord communication() const;
  // 8-bit gradients with error feedback: this rank's carried quantization errors, by the names
  // checkpoints keep them under (comm/error_feedback/..., one per world rank); else none.
  NamedTensors error_feedback();

  GradientBuffer& replicated() { return *replicated_; }
  // Expert parallelism's routed experts; nullptr without it.
  GradientBuffer* experts() { return experts_.get(); }
  // Whether this rank writes the experts it holds into checkpoints (the first of their holders).
  bool writes_experts() const;

 private:
  ParallelContext& parallel_;
  std::unique_ptr<GradientBuffer> replicated_, experts_;
};

}  // namespace dstrain
