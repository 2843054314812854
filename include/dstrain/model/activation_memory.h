// The activation memory of a training step, estimated from the model's shapes: what each decoder
// layer keeps for its backward pass per token (the inputs of its matrix products and
// nonlinearities, and of unfused attention the fp32 softmax probabilities), and the step's peak,
// which comes while the LM head's logits or gradients are made (its logits' gradient and the head
// weight's), while a recomputed layer reruns, or while the embedding's gradient is made. Measured
// peaks (core/step_memory.h) are the reference: bench/RESULTS.md compares the two.
#pragma once

#include <cstdint>
#include <vector>

#include "dstrain/model/fp8_recipe.h"
#include "dstrain/model/layer_slice.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/recompute.h"

namespace dstrain {

// The fused operations a run takes, which keep less for the backward pass than the same
// computation op by op.
struct FusedOperations {
  bool attention = false;  // scaled-dot-product attention: no score matrix
  bool rms_norm = false;   // LibTorch's RMSNorm kernel: its input and output, nothing between
  bool swiglu = false;     // dstrain's SwiGLU kernel: gate and up, not silu(gate) besides
  bool loss = false;       // dstrain's loss kernel: 16-bit logits read as they are, no fp32 copy
  // The routed experts' FP8 products on LibTorch's grouped kernel (Hopper), which takes rowwise
  // scales where blockwise ones are asked for (model/fp8_matmul.h).
  bool fp8_grouped_experts = false;
};

struct ActivationMemoryOptions {
  int64_t micro_batch = 1, seq_len = 1;
  int64_t element_bytes = 4;  // of the activations: 4 (fp32) or 2 (bf16, fp16)
  // train.fp8: the decoder layers' linear maps keep their inputs as E4M3 codes with their scales
  // (model/fp8_projection.h), a byte an element, in place of the 16-bit input where nothing else
  // keeps that; beside it where something does.
  Fp8Recipe fp8 = Fp8Recipe::kNone;
  RecomputePlan recompute;
  FusedOperations fused;
  // A pipeline stage's forward passes ahead of their backward; a fraction where a stage holds
  // some of its chunks' share of a micro-batch (the chunks taken as equal).
  double micro_batches_in_flight = 1;
  // Split backward passes (zero-bubble schedules): micro-batches past their B whose W is still to
  // come, holding what their weight gradients need (weight_store_elements).
  double micro_batches_awaiting_weights = 0;
  // The moment of the schedule (pipeline/simulator.h's LiveState), which says what is made then
  // besides what is kept: the LM head's logits as a forward pass ends, its gradients as a backward
  // pass starts, the embedding's gradient as one ends; a recomputed layer reruns as a backward pass
  // starts and, where W waits (its store filled meanwhile), as it ends. All three where the moment
  // is not known: a bound over the step.
  bool forward_ended = true, backward_starting = true, backward_ended = true;
  // Expert parallelism: MoE layers send their routed tokens to the experts' ranks and get the
  // outputs back, which adds a received copy each way (see mlp_elements).
  bool tokens_exchanged = false;
  // Tensor parallelism: a rank holds 1/tensor_parallel of the heads, FFN widths and vocabulary
  // (and routes that share of the tokens), while the split products' inputs are the whole
  // sequence's; with sequence parallelism the norms and residuals hold 1/tensor_parallel of it.
  int64_t tensor_parallel = 1;
  bool sequence_parallel = false;
  // Context parallelism: seq_len is a rank's share of the sequence (its chunks), whose queries
  // attend to context_parallel × seq_len keys through the ring (model/ring_attention.cpp), which
  // passes MLA's latents (or, not latent, its per-head keys and values).
  int64_t context_parallel = 1;
  bool context_parallel_latent = true;
};

// Elements a decoder layer (or a multi-token prediction module: `layer` ≥ num_layers) keeps per
// token when nothing is recomputed, or with options.recompute selective what that leaves (full
// recomputation is step_activation_bytes's to count).
double layer_activation_elements(const ModelConfig& model, int64_t layer, const ActivationMemoryOptions& options);

// Elements per token that a decoder layer (or a multi-token prediction module's: `layer` ≥
// num_layers) keeps between a split backward pass's B and its W: each projection's input (one
// tensor where two share it) and its output's gradient (pipeline/weight_gradient_store.h), whatever
// is recomputed.
double weight_store_elements(const ModelConfig& model, int64_t layer);

// The peak bytes above the step's start on a stage holding `chunks` (its model chunks' slices).
double step_activation_bytes(const ModelConfig& model, const std::vector<LayerSlice>& chunks,
                             const ActivationMemoryOptions& options);

}  // namespace dstrain
