// dstrain's own CUDA kernels (src/model/cuda: the LM loss's softmax, the SwiGLU activation, RoPE).
// Where they are built (a CUDA compiler at build time) and a chunk's ComputeOptions ask for them
// (train.cuda_kernels, on by default), the model uses them on GPU tensors; otherwise LibTorch's
// operations compute the same. The option is there to measure what the kernels gain and to rule
// them out when something looks wrong.
#pragma once

namespace dstrain {

constexpr bool cuda_kernels_built() {
#ifdef DSTRAIN_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

}  // namespace dstrain
