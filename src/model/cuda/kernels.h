// The host side of dstrain's own CUDA kernels: plain pointers and a stream, so that the .cu files
// need no LibTorch headers and the callers (src/model) need no CUDA compiler. Each launcher
// returns the launch's status for the caller to check. Built only where a CUDA compiler was found
// (DSTRAIN_WITH_CUDA_KERNELS); elsewhere the callers compute the same with LibTorch operations.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dstrain::cuda {

enum class Element { kFloat32, kBFloat16, kFloat16 };

// For each row r of `logits` ([rows, vocab], rows `row_stride` elements apart):
// losses[r] = logsumexp(row) − row[targets[r]] (fp32, NaN for a target outside the vocabulary),
// the softmax computed in fp32 in one pass over the row. With `write_gradient`, the row is then
// overwritten with its softmax minus the one-hot target, the target's entry as expm1 of its fp32
// log-probability. (Unscaled, fp16 loses the probabilities below 6e-8: training in fp16 takes
// LibTorch's graph, which applies the loss scale first.)
cudaError_t softmax_cross_entropy(void* logits, Element element, int64_t rows, int64_t vocab, int64_t row_stride,
                                  const int64_t* targets, float* losses, bool write_gradient, cudaStream_t stream);

// out = silu(gate) × up, element-wise over `count` contiguous elements (arithmetic in fp32).
cudaError_t swiglu_forward(const void* gate, const void* up, void* out, Element element, int64_t count,
                           cudaStream_t stream);

// The gradients of swiglu_forward's inputs from the gradient of its output, in one pass.
cudaError_t swiglu_backward(const void* grad_out, const void* gate, const void* up, void* grad_gate,
                            void* grad_up, Element element, int64_t count, cudaStream_t stream);

// Rotary position embedding of x [batch, heads, seq, head_dim] (any strides but the last, which
// is 1) into out (strides of its own): out_i = x_i cos_i + x_partner(i) sin_i at each position,
// from fp32 tables [seq, head_dim] whose rows are `table_stride` apart (rope.h: the sine table
// carries the rotation's sign). `inverse` rotates the other way: the gradient of the rotation.
struct RopeLayout {
  int64_t batch, heads, seq, head_dim;
  int64_t in_strides[3], out_strides[3];  // of batch, heads and seq, in elements
};
cudaError_t rope(const void* x, void* out, Element element, const RopeLayout& layout, const float* cos,
                 const float* sin, int64_t table_stride, bool interleave, bool inverse, cudaStream_t stream);

}  // namespace dstrain::cuda
