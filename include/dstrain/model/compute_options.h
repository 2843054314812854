// How a model chunk's modules compute, besides the model's shape (ModelConfig): chosen by whoever
// builds the chunk (the stage builder, from the run's configuration; eval and generate) and handed
// to every module at construction. The model reads no flag, global or thread-local state of its
// own, and reaches other ranks only through the interfaces given here.
#pragma once

#include <memory>

#include "dstrain/model/cuda_kernels.h"
#include "dstrain/model/fp8_recipe.h"
#include "dstrain/model/recompute.h"

namespace dstrain {

class ExpertExchange;          // expert_exchange.h
class GroupedMatmul;           // grouped_matmul.h
class Fp8Matmul;               // fp8_matmul.h
class TensorParallelGroup;     // tensor_parallel.h
class ContextParallelGroup;    // context_parallel.h
class WeightGradientDeferral;  // weight_gradient_deferral.h

struct ComputeOptions {
  // train.recompute: full reruns whole decoder layers (the first `layers` of each chunk), selective
  // the cheap parts of each; the reruns' host time counts on `rerun_clock` (nullptr: not counted).
  RecomputePlan recompute;
  RerunClock* rerun_clock = nullptr;
  // train.cuda_kernels: dstrain's own kernels (model/cuda) on GPU tensors; only where built.
  bool cuda_kernels = cuda_kernels_built();
  // train.grouped_experts: the routed experts' products as one grouped kernel where LibTorch has
  // one (shared by the chunk's layers, which stop trying together when LibTorch refuses it);
  // nullptr: one product per expert.
  std::shared_ptr<GroupedMatmul> grouped_matmul;
  // train.fp8: the decoder layers' linear maps (projections, dense MLPs, shared and routed
  // experts) compute in FP8 with this recipe (fp8_recipe.h); none: in the parameters' dtype.
  Fp8Recipe fp8 = Fp8Recipe::kNone;
  // With fp8: its products on LibTorch's FP8 kernel where it applies (shared by the chunk's layers,
  // which stop trying together when LibTorch refuses it); nullptr: emulated (fp8_products.h).
  std::shared_ptr<Fp8Matmul> fp8_matmul;
  // Zero-bubble schedules: where the products leave their weight gradients for the W action
  // (pipeline/weight_gradient_store.h); nullptr: never deferred.
  WeightGradientDeferral* deferral = nullptr;
  // Expert parallelism: how a MoE layer's rows reach the ranks that hold their experts
  // (parallel/expert_all_to_all.h); nullptr: the layer holds every expert and computes here.
  ExpertExchange* expert_exchange = nullptr;
  // Tensor parallelism: attention split by heads, dense MLPs (shared experts included) by FFN
  // width, the embedding, LM head and loss by vocabulary over this group (tensor_parallel.h;
  // which parameter splits how: tensor_parallel_split in parameter_shapes.h); nullptr: whole layers.
  TensorParallelGroup* tensor_parallel = nullptr;
  // Sequence parallelism (with tensor_parallel): between the split layers each rank holds 1/T of
  // the sequence (norms, residuals); the layers' all-reduces become an all-gather before and a
  // reduce-scatter after. MoE layers route each rank's own tokens (moe.h).
  bool sequence_parallel = false;
  // Context parallelism: each rank holds two of 2C chunks of every sequence, and attention runs
  // over the ring of this group (context_parallel.h); nullptr: whole sequences.
  ContextParallelGroup* context_parallel = nullptr;
  // With context_parallel, what MLA passes around the ring: its compressed latent and rope key
  // (true: parallel.cp_mla = latent), or the per-head keys and values (false: heads).
  bool context_parallel_latent = true;

  SelectiveRecompute selective() const { return {recompute.mode == Recompute::kSelective, rerun_clock}; }
};

}  // namespace dstrain
