// The process-wide switch for dstrain's own CUDA kernels (src/model/cuda: the LM loss's softmax,
// the SwiGLU activation, RoPE). Where they are built (a CUDA compiler at build time) and enabled
// (train.cuda_kernels, on by default), the model uses them on GPU tensors; otherwise LibTorch's
// operations compute the same. The switch is there to measure what the kernels gain and to rule
// them out when something looks wrong.
#pragma once

namespace dstrain {

bool cuda_kernels_built();
void enable_cuda_kernels(bool enabled);
bool cuda_kernels_enabled();  // built and enabled

}  // namespace dstrain
