// The LM loss's softmax, one thread block per row of logits, as llm.c's fused classifier does it.
//
// LibTorch's bf16 path converts the logits to an fp32 copy, takes its log-softmax (another fp32
// tensor, read twice) and exponentiates that into the gradient: about 24 bytes of memory traffic
// per logit, on tensors of 0.8 G logits per micro-batch. Here one pass reads the row and keeps a
// running maximum and sum of exponentials (the online softmax), and with a gradient a second pass
// reads the row again, mostly from L2, and writes the softmax over it: 4 to 6 bytes per logit.
#include <cmath>

#include "elements.cuh"
#include "kernels.h"

namespace dstrain::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;

// The online softmax's state: the largest logit seen and the sum of exp(x − max) over those seen.
// Exponentials are taken as exp2 (the GPU's native one) of (x − max) × log2(e): the difference
// first, so that logits near the maximum keep their precision. The sum is fp64: in a confident
// row it is 1 + ~1e-4 from tens of thousands of terms of ~1e-8, which an fp32 sum of 1 drops, and
// log(sum) is the target's log-probability and gradient.
struct Softmax {
  float max = -INFINITY;
  double sum = 0.0;

  // The larger of a and b, NaN if either is (fmaxf would drop a NaN logit, which must reach the
  // loss as LibTorch's does: the trainer skips or stops on a non-finite loss).
  __device__ static float max_of(float a, float b) { return (isnan(b) || b > a) ? b : a; }

  // sum × exp(max − new_max), exactly sum when the maximum has not moved.
  __device__ double rescaled(float new_max) const {
    return new_max == max ? sum : sum * exp2f((max - new_max) * kLog2e);
  }

  __device__ void add(const float* x, int n) {
    float new_max = max;
    for (int i = 0; i < n; ++i) new_max = max_of(new_max, x[i]);
    if (new_max == -INFINITY) return;  // only −inf so far: nothing to add (and −inf − −inf is NaN)
    double added = 0.0;
    for (int i = 0; i < n; ++i) added += exp2f((x[i] - new_max) * kLog2e);
    sum = rescaled(new_max) + added;
    max = new_max;
  }

  __device__ void merge(float other_max, double other_sum) {
    const float new_max = max_of(max, other_max);
    if (new_max == -INFINITY) return;
    const double other = other_max == new_max ? other_sum : other_sum * exp2f((other_max - new_max) * kLog2e);
    sum = rescaled(new_max) + other;
    max = new_max;
  }
};

// Every thread's state merged; every thread gets the result.
__device__ Softmax block_merge(Softmax s) {
  for (int offset = 16; offset > 0; offset /= 2)
    s.merge(__shfl_xor_sync(0xffffffffu, s.max, offset), __shfl_xor_sync(0xffffffffu, s.sum, offset));
  __shared__ float warp_max[kWarps];
  __shared__ double warp_sum[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = s.max, warp_sum[warp] = s.sum;
  __syncthreads();
  Softmax total;
  for (int w = 0; w < kWarps; ++w) total.merge(warp_max[w], warp_sum[w]);
  return total;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    softmax_cross_entropy_rows(T* logits, int64_t vocab, int64_t row_stride, bool packed, const int64_t* targets,
                               float* losses, bool write_gradient) {
  using P = Pack<T>;
  T* row = logits + static_cast<int64_t>(blockIdx.x) * row_stride;
  const int64_t target = targets[blockIdx.x];
  const bool target_valid = target >= 0 && target < vocab;
  // Read before any thread of the block overwrites the row (block_merge's barrier orders it).
  const float target_logit = threadIdx.x == 0 && target_valid ? to_float(row[target]) : NAN;
  const int64_t packs = packed ? vocab / P::kSize : 0, rest = packs * P::kSize;

  Softmax s;
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    const P pack = reinterpret_cast<const P*>(row)[p];
    float x[P::kSize];
    for (int i = 0; i < P::kSize; ++i) x[i] = to_float(pack.at[i]);
    s.add(x, P::kSize);
  }
  for (int64_t j = rest + threadIdx.x; j < vocab; j += kThreads) {
    const float x = to_float(row[j]);
    s.add(&x, 1);
  }
  s = block_merge(s);
  // log p(x) = (x − max) − log(sum); the loss is −log p(target).
  const float target_log_prob = static_cast<float>((target_logit - s.max) - log(s.sum));
  if (threadIdx.x == 0) losses[blockIdx.x] = -target_log_prob;
  if (!write_gradient) return;

  const float log2_sum = static_cast<float>(log2(s.sum));
  auto probability = [&](T logit) { return from_float<T>(exp2f((to_float(logit) - s.max) * kLog2e - log2_sum)); };
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    P pack = reinterpret_cast<const P*>(row)[p];
    for (int i = 0; i < P::kSize; ++i) pack.at[i] = probability(pack.at[i]);
    reinterpret_cast<P*>(row)[p] = pack;
  }
  for (int64_t j = rest + threadIdx.x; j < vocab; j += kThreads) row[j] = probability(row[j]);
  __syncthreads();
  // softmax − 1 at the target, from the fp32 log-probability: exp(lp) − 1 rounded from a
  // probability near one would lose the small gradient a confident row has.
  if (threadIdx.x == 0 && target_valid) row[target] = from_float<T>(expm1f(target_log_prob));
}

template <typename T>
cudaError_t launch(void* logits, int64_t rows, int64_t vocab, int64_t row_stride, const int64_t* targets,
                   float* losses, bool write_gradient, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // one block a row
  // 16-byte loads need every row to start on a 16-byte boundary.
  const bool packed = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && (row_stride * sizeof(T)) % 16 == 0;
  softmax_cross_entropy_rows<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<T*>(logits), vocab, row_stride, packed, targets, losses, write_gradient);
  return cudaGetLastError();
}

}  // namespace

cudaError_t softmax_cross_entropy(void* logits, Element element, int64_t rows, int64_t vocab, int64_t row_stride,
                                  const int64_t* targets, float* losses, bool write_gradient, cudaStream_t stream) {
  switch (element) {
    case Element::kFloat32:
      return launch<float>(logits, rows, vocab, row_stride, targets, losses, write_gradient, stream);
    case Element::kBFloat16:
      return launch<__nv_bfloat16>(logits, rows, vocab, row_stride, targets, losses, write_gradient, stream);
    case Element::kFloat16:
      return launch<__half>(logits, rows, vocab, row_stride, targets, losses, write_gradient, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dstrain::cuda
