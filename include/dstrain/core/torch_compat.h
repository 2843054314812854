// Everything that differs between LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (GPU clusters)
// lives here, so that the rest of the code reads the same for both.
#pragma once

#include "dstrain/core/fp8_e4m3.h"
#include "dstrain/core/torch_api.h"

#ifndef TORCH_VERSION_MAJOR
#include <torch/version.h>
#endif

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

// LibTorch major.minor or later: each fast path below names the release that brought its call,
// so that a 2.x older than it builds with the 1.13 path instead of failing to compile.
#define DSTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace dstrain::compat {

constexpr bool kHasFusedAttention = DSTRAIN_TORCH_AT_LEAST(2, 1);  // scaled_dot_product_attention(scale=)
// at::rms_norm runs as one kernel on CUDA tensors (aten::_fused_rms_norm), keeping only its input,
// output and the rows' scale; on the CPU it stays op by op. 2.6's headers have no such kernel, 2.11
// has (measured on an H200); it came between them: taken from 2.9.
constexpr bool kHasFusedRmsNormOnCuda = DSTRAIN_TORCH_AT_LEAST(2, 9);

// The autograd node that adds up a parameter's gradient, as grad_accumulator returns it: a
// std::shared_ptr up to LibTorch 2.12, a c10::intrusive_ptr from 2.13 on. Autograd itself keeps
// only a weak reference, so whoever hangs hooks on the node holds one of these.
using GradAccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));

// E4M3 elements as a tensor, from float values already scaled into E4M3's range (magnitudes
// beyond 448 saturate; NaN stays NaN), rounded to the nearest E4M3 value, ties to even: LibTorch's
// own float8_e4m3fn from 2.1 on, on any device; before it, core's uint8 codes (fp8_e4m3.h), on
// the CPU. from_e4m3 gives them back as float32.
inline torch::Tensor to_e4m3(const torch::Tensor& values) {
#if DSTRAIN_TORCH_AT_LEAST(2, 1)
  return values.to(torch::kFloat32).clamp(-kE4M3Max, kE4M3Max).to(torch::kFloat8_e4m3fn);
#else
  return e4m3_encode(values);
#endif
}
inline torch::Tensor from_e4m3(const torch::Tensor& elements) {
#if DSTRAIN_TORCH_AT_LEAST(2, 1)
  return elements.to(torch::kFloat32);
#else
  return e4m3_decode(elements);
#endif
}

// The softmax probabilities of causal attention, [batch, heads, queries, keys] in q's dtype (see
// causal_attention for the shapes): LibTorch 1.13's attention is these times the values.
inline torch::Tensor causal_attention_probabilities(const torch::Tensor& q, const torch::Tensor& k, double scale) {
  const int64_t queries = q.size(-2), keys = k.size(-2);
  if (queries > keys) throw std::invalid_argument("causal_attention: more queries than keys");
  const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)).mul(scale);
  // Adding -inf to the keys after each query (0 to the others) gives the values masked_fill
  // gives, in a cheaper pass whose backward pass is the identity.
  const torch::Tensor future =
      torch::full({queries, keys}, -std::numeric_limits<float>::infinity(), scores.options()).triu(keys - queries + 1);
  return torch::softmax(scores.add(future).to(torch::kFloat32), -1).to(q.scalar_type());
}

// Causal attention on [batch, heads, seq, head_dim] tensors with the given softmax scale. The
// queries are the last q.size(-2) positions of the keys (all of them in training; the new tokens
// in cached decoding): query i sees keys 0 .. k.size(-2) - q.size(-2) + i.
// LibTorch 2.x dispatches to flash / memory-efficient kernels; 1.13 computes it explicitly
// (softmax in fp32, so that low-precision inputs do not lose the normalisation).
inline torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, double scale) {
  const int64_t queries = q.size(-2), keys = k.size(-2);
  if (queries > keys) throw std::invalid_argument("causal_attention: more queries than keys");
#if DSTRAIN_TORCH_AT_LEAST(2, 1)
  if (queries == keys)
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, scale);
  // is_causal aligns the mask at the top left when queries < keys; the queries here are the last
  // positions, so the mask is given (true: attended).
  const torch::Tensor visible =
      torch::ones({queries, keys}, torch::dtype(torch::kBool).device(q.device())).tril(keys - queries);
  return at::scaled_dot_product_attention(q, k, v, visible, /*dropout_p=*/0.0, /*is_causal=*/false, scale);
#else
  return torch::matmul(causal_attention_probabilities(q, k, scale), v);
#endif
}

// Attention on [batch, heads, queries, head_dim] tensors where `visible` ([batch, 1, queries,
// keys], true: attended) says which keys each row's queries see: batched decoding, whose rows sit
// at positions of their own. The same kernels and softmax precision as causal_attention.
inline torch::Tensor masked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& visible, double scale) {
#if DSTRAIN_TORCH_AT_LEAST(2, 1)
  return at::scaled_dot_product_attention(q, k, v, visible, /*dropout_p=*/0.0, /*is_causal=*/false, scale);
#else
  const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)).mul(scale);
  const torch::Tensor hidden = scores.masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(hidden.to(torch::kFloat32), -1).to(q.scalar_type()), v);
#endif
}

// RMSNorm, normalising in fp32 whatever the activation dtype (the mean of squares is where bf16
// loses): LibTorch 2.x has a fused kernel for it; 1.13 computes it op by op.
inline torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
#if DSTRAIN_TORCH_AT_LEAST(2, 4)
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
#else
  torch::Tensor x32 = x.scalar_type() == torch::kFloat64 ? x : x.to(torch::kFloat32);  // at least fp32
  torch::Tensor normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
#endif
}

// dst[i].copy_(src[i]) for every i (converting dtypes): one multi-tensor kernel in LibTorch 2.x.
inline void copy_all(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src) {
#if DSTRAIN_TORCH_AT_LEAST(2, 2)
  at::_foreach_copy_(dst, src);
#else
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
#endif
}

// LibTorch 2.x has one fused AdamW kernel for a whole list of CUDA tensors (torch.optim.AdamW's
// fused=True); without it the optimizer runs its own per-tensor arithmetic.
inline bool has_fused_adamw(const torch::Device& device) {
  return DSTRAIN_TORCH_AT_LEAST(2, 1) && device.is_cuda();
}

// One AdamW update (decoupled weight decay) of every tensor of `params` from `grads`, as
// torch.optim.AdamW computes it, from the gradients divided by `grad_divisor` (0-dim, or undefined
// for one; the kernel stores the divided gradients back); `step` holds the (already incremented)
// step number and is read only; nothing changes when `found_inf` (0-dim, on the device) is non-zero.
inline void fused_adamw(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                        const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                        const std::vector<torch::Tensor>& steps, double lr, double beta1, double beta2,
                        double weight_decay, double eps, const torch::Tensor& grad_divisor,
                        const torch::Tensor& found_inf) {
#if DSTRAIN_TORCH_AT_LEAST(2, 1)
  if (grad_divisor.defined())
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/grad_divisor, found_inf);
  else
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/{}, found_inf);
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr, (void)beta1;
  (void)beta2, (void)weight_decay, (void)eps, (void)grad_divisor, (void)found_inf;
  throw std::logic_error("fused AdamW needs LibTorch 2.x");
#endif
}

// A profiled event's (torch::autograd::profiler::KinetoEvent's) start and duration in
// microseconds: LibTorch 2.x counts nanoseconds. (A template, so that this header need not
// include the profiler's.)
template <typename ProfiledEvent>
uint64_t profiled_start_us(const ProfiledEvent& event) {
#if DSTRAIN_TORCH_AT_LEAST(2, 1)
  return event.startNs() / 1000;
#else
  return event.startUs();
#endif
}

template <typename ProfiledEvent>
uint64_t profiled_duration_us(const ProfiledEvent& event) {
#if DSTRAIN_TORCH_AT_LEAST(2, 1)
  return event.durationNs() / 1000;
#else
  return event.durationUs();
#endif
}

}  // namespace dstrain::compat
