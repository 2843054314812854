// A rank's gradients, one GradientBuffer per set of ranks that hold the same copy of its
// parameters. The dense parameters are held by the dp-cp group, the routed experts by the edp
// group (parallel_grid.h): under expert parallelism a smaller one, each member of which receives
// the gradients of the tokens of a whole expert-parallel group (ep of the dense group's ranks).
// Their sum over the edp group therefore covers every rank's tokens once, and is divided by the
// dense group's size, as the others' average is. Without expert parallelism the two groups are
// one, and so is the buffer. The global norm counts every parameter once.
#pragma once

#include <memory>
#include <vector>

#include "dstrain/optim/grad_buffer.h"
#include "dstrain/parallel/communicator.h"

namespace dstrain {

// The groups a rank's gradients travel in (ParallelContext::group), which outlive the gradients.
struct GradientGroups {
  Communicator& dense;            // dp-cp: the copies of the dense parameters, averaged over it
  Communicator& experts;          // edp: the copies of the routed experts (the dense group when ep = 1)
  Communicator& expert_parallel;  // ep: the parts of one copy of the routed experts
  Communicator& stages;           // pp
  int world_rank;
};

class ModelGradients {
 public:
  // `params` by global name, `use_order` as GradientBuffer takes them; `reduction`'s group is
  // ignored: the dense group, and the experts' group for routed experts.
  ModelGradients(const NamedTensors& params, const std::vector<torch::Tensor>& use_order, GradientReduction reduction,
                 const GradientGroups& groups);

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
  GradientGroups groups_;
  std::unique_ptr<GradientBuffer> replicated_, experts_;
};

}  // namespace dstrain
