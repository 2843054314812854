// The SwiGLU activation, silu(gate) × up, and its gradient, each one element-wise pass.
//
// As LibTorch operations the activation is two kernels (silu, then the product) and its gradient
// three (two products and silu's backward), over [tokens, intermediate] tensors, the widest
// activations of the model; autograd also keeps silu(gate) for the backward pass. Fused: 3
// instead of 5 tensor passes forward, 5 instead of 9 backward, and nothing kept but gate and up.
#include <cstdint>

#include "elements.cuh"
#include "kernels.h"

namespace dstrain::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// An element-wise function: the elements at one index of its inputs to those of its outputs.
struct Forward {
  static constexpr int kInputs = 2, kOutputs = 1;  // (gate, up) -> out
  __device__ static void apply(const float* in, float* out) {
    const float g = in[0];
    out[0] = g * sigmoid(g) * in[1];
  }
};

// d/dgate silu(gate) = σ(gate) (1 + gate (1 − σ(gate))).
struct Backward {
  static constexpr int kInputs = 3, kOutputs = 2;  // (grad_out, gate, up) -> (grad_gate, grad_up)
  __device__ static void apply(const float* in, float* out) {
    const float dy = in[0], g = in[1], u = in[2];
    const float s = sigmoid(g);
    out[0] = dy * u * s * (1.f + g * (1.f - s));
    out[1] = dy * g * s;
  }
};

// Kernel arguments: a fixed number of pointers, passed by value.
template <typename T, int N>
struct Pointers {
  T* at[N];
};

// Element i of each tensor, for every i below count: 16-byte packs where every pointer allows them
// (the callers' tensors are fresh allocations, so almost always), then one element at a time. The
// arithmetic is in fp32 whatever T is.
template <typename Op, typename T>
__global__ void elementwise_kernel(Pointers<const T, Op::kInputs> in, Pointers<T, Op::kOutputs> out, int64_t count,
                                   bool packed) {
  using P = Pack<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? count / P::kSize : 0;
  float x[Op::kInputs], y[Op::kOutputs];
  for (int64_t p = first; p < packs; p += stride) {
    P loaded[Op::kInputs], stored[Op::kOutputs];
#pragma unroll
    for (int j = 0; j < Op::kInputs; ++j) loaded[j] = reinterpret_cast<const P*>(in.at[j])[p];
#pragma unroll
    for (int i = 0; i < P::kSize; ++i) {
#pragma unroll
      for (int j = 0; j < Op::kInputs; ++j) x[j] = to_float(loaded[j].at[i]);
      Op::apply(x, y);
#pragma unroll
      for (int j = 0; j < Op::kOutputs; ++j) stored[j].at[i] = from_float<T>(y[j]);
    }
#pragma unroll
    for (int j = 0; j < Op::kOutputs; ++j) reinterpret_cast<P*>(out.at[j])[p] = stored[j];
  }
  for (int64_t i = packs * P::kSize + first; i < count; i += stride) {
#pragma unroll
    for (int j = 0; j < Op::kInputs; ++j) x[j] = to_float(in.at[j][i]);
    Op::apply(x, y);
#pragma unroll
    for (int j = 0; j < Op::kOutputs; ++j) out.at[j][i] = from_float<T>(y[j]);
  }
}

// A thread for each pack and each element after the packs, up to enough blocks to fill the GPU
// several times over; each thread strides through the rest.
template <typename T>
unsigned blocks_for(int64_t count, bool packed) {
  const int64_t size = Pack<T>::kSize, items = packed ? count / size + count % size : count;
  const int64_t wanted = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
}

template <typename Op, typename T>
cudaError_t launch_typed(const void* const* in, void* const* out, int64_t count, cudaStream_t stream) {
  Pointers<const T, Op::kInputs> inputs;
  Pointers<T, Op::kOutputs> outputs;
  bool packed = true;
  for (int j = 0; j < Op::kInputs; ++j) {
    inputs.at[j] = static_cast<const T*>(in[j]);
    packed = packed && reinterpret_cast<uintptr_t>(in[j]) % 16 == 0;
  }
  for (int j = 0; j < Op::kOutputs; ++j) {
    outputs.at[j] = static_cast<T*>(out[j]);
    packed = packed && reinterpret_cast<uintptr_t>(out[j]) % 16 == 0;
  }
  elementwise_kernel<Op, T><<<blocks_for<T>(count, packed), kThreads, 0, stream>>>(inputs, outputs, count, packed);
  return cudaGetLastError();
}

// `in` and `out`: Op::kInputs and Op::kOutputs pointers to `count` contiguous elements each.
template <typename Op>
cudaError_t launch(const void* const* in, void* const* out, Element element, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (element) {
    case Element::kFloat32: return launch_typed<Op, float>(in, out, count, stream);
    case Element::kBFloat16: return launch_typed<Op, __nv_bfloat16>(in, out, count, stream);
    case Element::kFloat16: return launch_typed<Op, __half>(in, out, count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t swiglu_forward(const void* gate, const void* up, void* out, Element element, int64_t count,
                           cudaStream_t stream) {
  const void* const in[] = {gate, up};
  void* const outputs[] = {out};
  return launch<Forward>(in, outputs, element, count, stream);
}

cudaError_t swiglu_backward(const void* grad_out, const void* gate, const void* up, void* grad_gate,
                            void* grad_up, Element element, int64_t count, cudaStream_t stream) {
  const void* const in[] = {grad_out, gate, up};
  void* const out[] = {grad_gate, grad_up};
  return launch<Backward>(in, out, element, count, stream);
}

}  // namespace dstrain::cuda
