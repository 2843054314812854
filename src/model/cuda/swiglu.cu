// The SwiGLU activation, silu(gate) × up, and its gradient, each one element-wise pass.
//
// As LibTorch operations the activation is two kernels (silu, then the product) and its gradient
// three (two products and silu's backward), over [tokens, intermediate] tensors, the widest
// activations of the model; autograd also keeps silu(gate) for the backward pass. Fused: 3
// instead of 5 tensor passes forward, 5 instead of 9 backward, and nothing kept but gate and up.
#include <initializer_list>

#include "elements.cuh"
#include "kernels.h"

namespace dstrain::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

struct Forward {
  template <typename T>
  __device__ static void apply(const T* gate, const T* up, T* out, int64_t i) {
    const float g = to_float(gate[i]);
    out[i] = from_float<T>(g * sigmoid(g) * to_float(up[i]));
  }
};

// d/dgate silu(gate) = σ(gate) (1 + gate (1 − σ(gate))).
struct Backward {
  template <typename T>
  __device__ static void apply(const T* grad_out, const T* gate, const T* up, T* grad_gate, T* grad_up, int64_t i) {
    const float dy = to_float(grad_out[i]), g = to_float(gate[i]), u = to_float(up[i]);
    const float s = sigmoid(g);
    grad_gate[i] = from_float<T>(dy * u * s * (1.f + g * (1.f - s)));
    grad_up[i] = from_float<T>(dy * g * s);
  }
};

// Element i of each tensor, every i below count: 16-byte packs where every pointer allows them
// (the callers' tensors are fresh allocations, so almost always), then one element at a time.
template <typename T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* out, int64_t count, bool packed) {
  using P = Pack<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? count / P::kSize : 0;
  for (int64_t p = first; p < packs; p += stride) {
    const P g = reinterpret_cast<const P*>(gate)[p], u = reinterpret_cast<const P*>(up)[p];
    P y;
    for (int i = 0; i < P::kSize; ++i) Forward::apply(g.at, u.at, y.at, i);
    reinterpret_cast<P*>(out)[p] = y;
  }
  for (int64_t i = packs * P::kSize + first; i < count; i += stride) Forward::apply(gate, up, out, i);
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* grad_out, const T* gate, const T* up, T* grad_gate, T* grad_up,
                                       int64_t count, bool packed) {
  using P = Pack<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? count / P::kSize : 0;
  for (int64_t p = first; p < packs; p += stride) {
    const P dy = reinterpret_cast<const P*>(grad_out)[p], g = reinterpret_cast<const P*>(gate)[p],
            u = reinterpret_cast<const P*>(up)[p];
    P dg, du;
    for (int i = 0; i < P::kSize; ++i) Backward::apply(dy.at, g.at, u.at, dg.at, du.at, i);
    reinterpret_cast<P*>(grad_gate)[p] = dg;
    reinterpret_cast<P*>(grad_up)[p] = du;
  }
  for (int64_t i = packs * P::kSize + first; i < count; i += stride)
    Backward::apply(grad_out, gate, up, grad_gate, grad_up, i);
}

bool aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// A thread for each pack and each element after the packs, up to enough blocks to fill the GPU
// several times over; each thread strides through the rest.
template <typename T>
unsigned blocks_for(int64_t count, bool packed) {
  const int64_t size = Pack<T>::kSize, items = packed ? count / size + count % size : count;
  const int64_t wanted = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
}

template <typename T>
cudaError_t forward(const void* gate, const void* up, void* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const bool packed = aligned({gate, up, out});
  swiglu_forward_kernel<T><<<blocks_for<T>(count, packed), kThreads, 0, stream>>>(
      static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), count, packed);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const void* grad_out, const void* gate, const void* up, void* grad_gate, void* grad_up,
                     int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const bool packed = aligned({grad_out, gate, up, grad_gate, grad_up});
  swiglu_backward_kernel<T><<<blocks_for<T>(count, packed), kThreads, 0, stream>>>(
      static_cast<const T*>(grad_out), static_cast<const T*>(gate), static_cast<const T*>(up),
      static_cast<T*>(grad_gate), static_cast<T*>(grad_up), count, packed);
  return cudaGetLastError();
}

}  // namespace

cudaError_t swiglu_forward(const void* gate, const void* up, void* out, Element element, int64_t count,
                           cudaStream_t stream) {
  switch (element) {
    case Element::kFloat32: return forward<float>(gate, up, out, count, stream);
    case Element::kBFloat16: return forward<__nv_bfloat16>(gate, up, out, count, stream);
    case Element::kFloat16: return forward<__half>(gate, up, out, count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t swiglu_backward(const void* grad_out, const void* gate, const void* up, void* grad_gate,
                            void* grad_up, Element element, int64_t count, cudaStream_t stream) {
  switch (element) {
    case Element::kFloat32: return backward<float>(grad_out, gate, up, grad_gate, grad_up, count, stream);
    case Element::kBFloat16: return backward<__nv_bfloat16>(grad_out, gate, up, grad_gate, grad_up, count, stream);
    case Element::kFloat16: return backward<__half>(grad_out, gate, up, grad_gate, grad_up, count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dstrain::cuda
