// A rank's gradients, one GradientBuffer per set of ranks that hold the same copy of its
// parameters. The dense parameters are held by the dp-cp group, the routed experts by the edp
// group (parallel_grid.h): under expert parallelism a smaller one, each member of which receives
// the gradients of the tokens of a whole expert-parallel group (ep of the dense group's ranks).
// Their sum over the edp group therefore covers every rank's tokens once, and is divided by the
// dense group's size, as the others' average is. Without expert parallelism the two groups are
// one, and so is the buffer. The global norm counts every parameter once.
//
// Under tensor parallelism the ranks of a tp group hold different parts of the split parameters,
// and copies of the whole ones, some of whose gradients are each rank's part (the router's, and
// under sequence parallelism the norms': tensor_parallel_partial_gradient): those are summed over
// the tp group after the data-parallel average. The routed experts always have a buffer of their
// own then, since the edp group spans the tp ranks.
#pragma once

#include <functional>
#include <memory>
#include <string>
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
  Communicator& tensor_parallel;  // tp: the parts of one copy of the split parameters
  int world_rank;
};

// Which parameters (by global name) tensor parallelism splits, and whose gradient is a rank's part.
struct TensorParallelParameters {
  std::function<bool(const std::string&)> split, partial_gradient;
};

class ModelGradients {
 public:
  // `params` by global name, `use_order` as GradientBuffer takes them; `reduction`'s group is
  // ignored: the dense group, and the experts' group for routed experts.
  ModelGradients(const NamedTensors& params, const std::vector<torch::Tensor>& use_order, GradientReduction reduction,
                 const GradientGroups& groups, TensorParallelParameters tensor_parallel = {});

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
  // The replicated buffer's sum of squares, under tensor parallelism: the split parameters' parts
  // summed over the tp group, the whole ones counted once.
  torch::Tensor tensor_parallel_squares();
  void sum_partial_gradients();

  GradientGroups groups_;
  TensorParallelParameters tensor_parallel_;
  std::unique_ptr<GradientBuffer> replicated_, experts_;
  std::vector<torch::Tensor> partial_grads_;  // the replicated buffer's gradients the tp group sums
};

}  // namespace dstrain
