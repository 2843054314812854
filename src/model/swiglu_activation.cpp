#include "dstrain/model/swiglu_activation.h"

#ifdef DSTRAIN_WITH_CUDA_KERNELS
#include <torch/csrc/autograd/custom_function.h>

#include "cuda/launch.h"
#endif

namespace dstrain {
namespace {

#ifdef DSTRAIN_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FusedSwiGLU : public torch::autograd::Function<FusedSwiGLU> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate, const torch::Tensor& up) {
    const c10::cuda::CUDAGuard guard(gate.device());
    torch::Tensor out = torch::empty_like(gate, torch::MemoryFormat::Contiguous);
    C10_CUDA_CHECK(cuda::swiglu_forward(gate.data_ptr(), up.data_ptr(), out.data_ptr(), *cuda::element_of(gate),
                                        gate.numel(), cuda::stream_of(gate)));
    ctx->save_for_backward({gate, up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &gate = saved[0], &up = saved[1];
    const c10::cuda::CUDAGuard guard(gate.device());
    const torch::Tensor grad_out = grad_outputs[0].to(gate.scalar_type()).contiguous();
    torch::Tensor grad_gate = torch::empty_like(gate, torch::MemoryFormat::Contiguous);
    torch::Tensor grad_up = torch::empty_like(up, torch::MemoryFormat::Contiguous);
    C10_CUDA_CHECK(cuda::swiglu_backward(grad_out.data_ptr(), gate.data_ptr(), up.data_ptr(), grad_gate.data_ptr(),
                                         grad_up.data_ptr(), *cuda::element_of(gate), gate.numel(),
                                         cuda::stream_of(gate)));
    return {grad_gate, grad_up};
  }
};

// The kernels read both inputs as one flat array of one element type.
bool fused_kernel_applies(const torch::Tensor& gate, const torch::Tensor& up) {
  return cuda::element_of(gate) && gate.scalar_type() == up.scalar_type() && gate.device() == up.device() &&
         gate.sizes() == up.sizes() && gate.is_contiguous() && up.is_contiguous();
}
#endif

}  // namespace

torch::Tensor swiglu_activation(const torch::Tensor& gate, const torch::Tensor& up, bool cuda_kernel) {
#ifdef DSTRAIN_WITH_CUDA_KERNELS
  if (cuda_kernel && fused_kernel_applies(gate, up)) return FusedSwiGLU::apply(gate, up);
#else
  (void)cuda_kernel;
#endif
  return torch::silu(gate) * up;
}

}  // namespace dstrain
