#include "dstrain/model/activation_memory.h"

#include <algorithm>

#include "dstrain/model/context_parallel.h"
#include "dstrain/model/linear_cross_entropy.h"

namespace dstrain {
namespace {

// An RMSNorm computed op by op on 16-bit activations also keeps the fp32 copy of its input that it
// normalises (compat::rms_norm): an element more for each of its input's.
double norm_input_copy(const ActivationMemoryOptions& o) {
  return !o.fused.rms_norm && o.element_bytes < 4 ? 1.0 : 0.0;
}

// What an RMSNorm keeps besides its output (which the product after it keeps): fused its input; op
// by op also its normalised values, and on 16-bit activations its input as an fp32 copy.
double norm_elements_besides_output(const ActivationMemoryOptions& o) {
  return o.fused.rms_norm ? 1.0 : 2.0 + norm_input_copy(o);
}

// MLA's latents: the query's with its norm (input, normalised, output), the key-value latent with
// its norm and the rope part.
double mla_latent_elements(const ModelConfig& c, const ActivationMemoryOptions& o) {
  const double norm = norm_input_copy(o);
  return (3.0 + norm) * static_cast<double>(c.q_lora_rank) + (4.0 + norm) * static_cast<double>(c.kv_lora_rank) +
         static_cast<double>(c.qk_rope_head_dim);
}

// Ring attention (model/ring_attention.cpp) keeps its queries, what it passed, its output (and
// o_proj's copy of it) and an fp32 log-sum-exp per head; none of the other ranks' keys and values
// nor any scores. It passes MLA's latent and rope key (or per head the keys and values), a dense
// model's key-value heads.
double ring_attention_elements(const ModelConfig& c, const ActivationMemoryOptions& o) {
  const double heads = static_cast<double>(c.num_heads), lse = heads * 4.0 / o.element_bytes;
  if (!c.is_mla()) {
    const double d = static_cast<double>(c.head_dim());
    return 3.0 * heads * d + 2.0 * static_cast<double>(c.num_kv_heads) * d + lse;
  }
  const double qk = static_cast<double>(c.qk_head_dim()), v = static_cast<double>(c.value_head_dim());
  const double passed = o.context_parallel_latent ? static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim)
                                                  : heads * (qk + v);
  return mla_latent_elements(c, o) + heads * (qk + 2.0 * v) + passed + lse;
}

// Attention, MHA/GQA: the rotated queries, the keys and values repeated to every head, the
// output before o_proj (4 × heads × head_dim); and the softmax probabilities (fp32) of unfused
// attention, or the log-sum-exp per head of fused attention.
// Selective recomputation keeps of MLA only the latents its up-projections start from (the
// query's, or without q_lora_rank the query itself, and the key-value latent with the rope part)
// and per head the output: the norms, queries, keys and values are computed again. Of unfused
// attention it keeps no probabilities (causal_attention.h), of MHA what attention keeps without it.
double attention_elements(const ModelConfig& c, bool selective, const ActivationMemoryOptions& o) {
  if (o.context_parallel > 1) return ring_attention_elements(c, o);
  const double heads = static_cast<double>(c.num_heads);
  // Unfused, 16-bit activations keep the fp32 probabilities (softmax's) and their 16-bit copy
  // (the product with the values'): compat::causal_attention_probabilities.
  const double copy = o.element_bytes < 4 ? 1.0 : 0.0;
  const double probabilities = heads * static_cast<double>(o.seq_len) * (4.0 / o.element_bytes + copy);
  const double scores = o.fused.attention ? heads : selective ? 0.0 : probabilities;
  if (!c.is_mla()) return 4.0 * heads * static_cast<double>(c.head_dim()) + scores;
  const double q_lora = static_cast<double>(c.q_lora_rank), kv_lora = static_cast<double>(c.kv_lora_rank);
  const double rope = static_cast<double>(c.qk_rope_head_dim);
  if (selective) {
    const double query_input = c.q_lora_rank > 0 ? q_lora : heads * c.qk_head_dim();
    return query_input + kv_lora + rope + heads * c.value_head_dim() + scores;
  }
  // MLA: per head the query and key (qk), the value and the output (v).
  return mla_latent_elements(c, o) + heads * (2.0 * c.qk_head_dim() + 2.0 * c.value_head_dim()) + scores;
}

// The MLP: SwiGLU keeps gate, up, silu(gate) and their product (4 × intermediate). DeepSeekMoE:
// the router's fp32 logits, scores and choice, each routed token's copy of its input and its
// expert's SwiGLU, the weighted outputs, and the shared experts' SwiGLU.
// With the tokens exchanged between ranks, each routed copy also arrives at its expert's rank
// (the input the expert's matrix products keep) and its output comes back (what the weighting
// keeps): 2 × hidden more per routed copy. Counted as if experts were evenly loaded, so that a
// rank receives as many copies as it sends.
// Fused, the activation keeps gate and up and makes the product (3 × intermediate with it).
// Selective recomputation keeps of each SwiGLU only gate and up (2 × intermediate).
double mlp_elements(const ModelConfig& c, int64_t layer, bool selective, const ActivationMemoryOptions& o) {
  const double swiglu = selective ? 2.0 : o.fused.swiglu ? 3.0 : 4.0;
  if (!c.is_moe_layer(layer)) return swiglu * static_cast<double>(c.intermediate_size);
  const double k = static_cast<double>(c.num_experts_per_tok), h = static_cast<double>(c.hidden_size);
  const double per_copy = (o.tokens_exchanged ? 4.0 : 2.0) * h + swiglu * static_cast<double>(c.moe_intermediate_size);
  const double router = 3.0 * static_cast<double>(c.n_routed_experts) * 4.0 / o.element_bytes;  // fp32
  return router + k * per_copy +
         swiglu * static_cast<double>(c.n_shared_experts * c.moe_intermediate_size);
}

// What the head and the embedding make besides what the layers keep, at the moments of
// ActivationMemoryOptions: in the head's forward pass the logits' gradient and the fp32
// log-probabilities of a chunk; as its backward pass starts the logits' gradient and, with 16-bit
// parameters, the head weight's gradient (fp32 parameters have it added straight into their fp32
// gradient: linear_cross_entropy.cpp); as the embedding's backward pass ends (the last of a
// stage's) the embedding weight's gradient, made whole before it is added to the parameter's.
// At both moments of the head, each head's final norm and input (that of the multi-token
// prediction modules' too, with their two input norms), which their backward passes free.
double head_and_embedding_bytes(const ModelConfig& c, const LayerSlice& slice, const ActivationMemoryOptions& o) {
  const double tokens = static_cast<double>(o.micro_batch * o.seq_len);
  const double vocab = static_cast<double>(c.vocab_size) / static_cast<double>(o.tensor_parallel);  // a rank's shard
  const double h = static_cast<double>(c.hidden_size);
  const double weight_gradient = vocab * h * static_cast<double>(o.element_bytes);
  const double head_weight_gradient = o.element_bytes == 4 ? 0.0 : weight_gradient;
  const double logits = tokens * vocab * static_cast<double>(o.element_bytes);
  const double held_h = o.sequence_parallel ? h / static_cast<double>(o.tensor_parallel) : h;
  const double norm = norm_elements_besides_output(o), modules = static_cast<double>(c.num_nextn_predict_layers);
  const double heads = ((1.0 + 3.0 * modules) * norm * held_h + (1.0 + modules) * h) * tokens * o.element_bytes;
  double bytes = 0;
  // A chunk's fp32 log-probabilities; from 16-bit logits, where the loss has no kernel that reads
  // them as they are, after an fp32 copy of the chunk.
  const double chunks = o.element_bytes < 4 && !o.fused.loss ? 2.0 : 1.0;
  if (slice.has_head && o.forward_ended)
    bytes = std::max(bytes, heads + logits +
                                chunks * std::min(tokens * vocab, static_cast<double>(kLossChunkElements)) * 4);
  if (slice.has_head && o.backward_starting) bytes = std::max(bytes, heads + logits + head_weight_gradient);
  if (slice.has_embedding && o.backward_ended) bytes = std::max(bytes, weight_gradient);
  return bytes;
}

// What ring attention's backward pass makes for a ring step of a layer: the keys and values it
// expanded and their gradients, the queries' gradient, the output and its gradient, all fp32, and
// a block of scores with the probabilities and their gradients (model/ring_attention.cpp).
double ring_backward_bytes(const ModelConfig& c, const ActivationMemoryOptions& o) {
  if (o.context_parallel == 1) return 0;
  const double heads = static_cast<double>(c.num_heads) / static_cast<double>(o.tensor_parallel);
  const double qk = static_cast<double>(c.is_mla() ? c.qk_head_dim() : c.head_dim());
  const double v = static_cast<double>(c.is_mla() ? c.value_head_dim() : c.head_dim());
  const double tokens = static_cast<double>(o.micro_batch * o.seq_len), chunk = static_cast<double>(o.seq_len / 2);
  const double block = std::min(static_cast<double>(kRingScoreBlockElements), o.micro_batch * heads * chunk * chunk);
  return heads * (3.0 * qk + 4.0 * v) * tokens * 4.0 + 4.0 * block * 4.0;
}

// What FP8 changes of a layer's elements (fp8 in ActivationMemoryOptions), counted in elements of
// o.element_bytes: an input only linear maps keep shrinks to a byte (and its scales: 4 bytes a
// 128-element tile under blockwise); where something else keeps it too, the byte comes on top.
// Kept by linear maps only: the normalised inputs of attention and of a dense MLP, MLA's normalised
// latents, the SwiGLU products into down (of routed and shared experts too), the routed copies of
// the tokens (those received, where exchanged); without fused attention o_proj's input. Kept
// besides: the MoE layer's normalised input, which the router keeps in 16 bits, for the shared
// experts; fused attention's output, of which o_proj's input is a view. Selective recomputation
// and the emulation's fp32 operands, made while a product runs, are not counted apart.
double fp8_elements(const ModelConfig& c, int64_t layer, const ActivationMemoryOptions& o) {
  if (o.fp8 == Fp8Recipe::kNone) return 0;
  const double byte = (1.0 + (o.fp8 == Fp8Recipe::kBlockwise ? 4.0 / kFp8TileEdge : 0.0)) / o.element_bytes;
  const double h = static_cast<double>(c.hidden_size), heads = static_cast<double>(c.num_heads);
  const double attention_output = heads * static_cast<double>(c.is_mla() ? c.value_head_dim() : c.head_dim());
  double shrunk = o.fused.attention ? 0.0 : attention_output, added = o.fused.attention ? attention_output : 0.0;
  shrunk += h;  // attention's normalised input
  if (c.is_mla()) shrunk += static_cast<double>(c.q_lora_rank + c.kv_lora_rank);
  if (!c.is_moe_layer(layer)) {
    shrunk += h + static_cast<double>(c.intermediate_size);
  } else {
    const double expert = static_cast<double>(c.moe_intermediate_size);
    shrunk += static_cast<double>(c.num_experts_per_tok) * (h + expert) +
              static_cast<double>(c.n_shared_experts) * expert;
    if (c.n_shared_experts > 0) added += h;
  }
  return shrunk * (byte - 1.0) + added * byte;
}

}  // namespace

double layer_activation_elements(const ModelConfig& c, int64_t layer, const ActivationMemoryOptions& o) {
  // The two RMSNorms. Fused (LibTorch's CUDA kernel), each keeps its input and output; op by op
  // also its normalised values and one more intermediate: 4 × hidden a norm, as measured on the
  // CPU (the 1B preset on an H200 kept 4 × hidden a layer less fused). Under selective
  // recomputation, either way, each keeps its input only.
  // Op by op on 16-bit activations, each keeps the fp32 copy of its input besides (norm_input_copy).
  const bool selective = o.recompute.mode == Recompute::kSelective;
  const double h = static_cast<double>(c.hidden_size);
  const double norms = selective ? 2.0 : o.fused.rms_norm ? 4.0 : 8.0 + 2.0 * norm_input_copy(o);
  const double split_layers = attention_elements(c, selective, o) + mlp_elements(c, layer, selective, o) +
                              (selective ? 0.0 : fp8_elements(c, layer, o));
  if (o.tensor_parallel == 1) return norms * h + split_layers;
  // The attention's and the MLP's inputs are kept as they enter: the whole sequence without
  // sequence parallelism, a rank's part with it (the projections gather it again in the backward
  // pass: tensor_parallel_projections.h); the rest of them is split.
  const double parts = static_cast<double>(o.tensor_parallel), held = o.sequence_parallel ? 1.0 / parts : 1.0;
  return (norms + 2.0) * h * held + (split_layers - 2.0 * h) / parts;
}

double weight_store_elements(const ModelConfig& c, int64_t layer) {
  const double h = static_cast<double>(c.hidden_size), heads = static_cast<double>(c.num_heads);
  double attention = 0;
  if (c.is_mla()) {
    const double q_lora = static_cast<double>(c.q_lora_rank), kv_lora = static_cast<double>(c.kv_lora_rank);
    const double qk = static_cast<double>(c.qk_head_dim()), v = static_cast<double>(c.value_head_dim());
    const double nope = static_cast<double>(c.qk_nope_head_dim), rope = static_cast<double>(c.qk_rope_head_dim);
    // q_a_proj and q_b_proj (or q_proj): the latent between them and both gradients.
    const double query = c.q_lora_rank > 0 ? 2.0 * q_lora + heads * qk : heads * qk;
    // The normalised input (q_a_proj's and kv_a_proj_with_mqa's), the query's, kv_a_proj_with_mqa's
    // gradient, kv_b_proj's input and gradient, o_proj's input and gradient.
    attention = h + query + (kv_lora + rope) + kv_lora + heads * (nope + v) + heads * v + h;
  } else {
    const double d = static_cast<double>(c.head_dim()), kv_heads = static_cast<double>(c.num_kv_heads);
    attention = h + heads * d + 2.0 * kv_heads * d + heads * d + h;  // q, k, v's; o_proj's
  }
  // A SwiGLU: its input (gate's and up's), the activation into down, and the three gradients.
  auto swiglu = [h](double intermediate) { return 2.0 * h + 3.0 * intermediate; };
  double mlp = swiglu(static_cast<double>(c.intermediate_size));
  if (c.is_moe_layer(layer)) {
    const double expert = static_cast<double>(c.moe_intermediate_size);
    mlp = static_cast<double>(c.num_experts_per_tok) * swiglu(expert) +
          (c.n_shared_experts > 0 ? swiglu(static_cast<double>(c.n_shared_experts) * expert) : 0.0);
  }
  const double mtp_projection = layer >= c.num_layers ? 3.0 * h : 0.0;  // eh_proj: [h; embedding] in, h out
  return attention + mlp + mtp_projection;
}

double step_activation_bytes(const ModelConfig& c, const std::vector<LayerSlice>& chunks,
                             const ActivationMemoryOptions& o) {
  const double tokens = static_cast<double>(o.micro_batch * o.seq_len) * static_cast<double>(o.element_bytes);
  const double h = static_cast<double>(c.hidden_size), parts = static_cast<double>(o.tensor_parallel);
  const double held_h = o.sequence_parallel ? h / parts : h;  // a layer input's share a rank holds
  double kept = 0, rerun = 0, made = 0, awaiting_weights = 0;
  // The decoder layer `layer`, at `index` in its chunk: all it keeps, or under full recomputation
  // its input, and then all it keeps again while it reruns (returned; 0 if it does not).
  auto add_layer = [&](int64_t layer, int64_t index) {
    awaiting_weights += weight_store_elements(c, layer) / parts * tokens;
    const bool recomputed = o.recompute.reruns_layer(index);
    const double full = layer_activation_elements(c, layer, o) * tokens;  // (full: as if none)
    kept += recomputed ? held_h * tokens : full;
    if (recomputed) rerun = std::max(rerun, full);
    return recomputed ? full : 0.0;
  };
  for (const LayerSlice& slice : chunks) {
    for (int64_t layer = slice.first; layer < slice.last; ++layer) add_layer(layer, layer - slice.first);
    made = std::max(made, head_and_embedding_bytes(c, slice, o));
    if (!slice.has_head) continue;
    // Multi-token prediction: each module's layer, after the chunk's last one; its projection's
    // input ([normalised hidden; embedding]) and its logits' gradient, whatever is recomputed. Its
    // layer's backward pass comes first, so a rerun of it meets the main head's logits' gradient,
    // which the main head's backward pass has yet to use.
    const double vocab = static_cast<double>(c.vocab_size) / parts;
    const double mtp_per_token = 2.0 * h + vocab;
    for (int64_t depth = 1; depth <= c.num_nextn_predict_layers; ++depth) {
      const double rerun_here = add_layer(c.num_layers + depth - 1, slice.last - slice.first + depth - 1);
      kept += mtp_per_token * tokens;
      if (o.backward_starting) made = std::max(made, vocab * tokens + rerun_here);
    }
  }
  // The backward pass's working set on top: the gradients flowing between layers and those of a
  // layer's widest matrix products (an MLP's gate and up).
  const double widest = static_cast<double>(std::max(c.intermediate_size, c.moe_intermediate_size)) / parts;
  const double working = (2.0 * h + 2.0 * widest) * tokens + ring_backward_bytes(c, o);
  const bool rerunning = o.backward_starting || (o.backward_ended && o.micro_batches_awaiting_weights > 0);
  return kept * o.micro_batches_in_flight + awaiting_weights * o.micro_batches_awaiting_weights +
         std::max(made, rerunning ? rerun : 0.0) + working;
}

}  // namespace dstrain
