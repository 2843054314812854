#include "dstrain/model/linear_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#ifdef DSTRAIN_WITH_CUDA_KERNELS
#include "cuda/launch.h"
#endif

namespace dstrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// How the rows' losses are computed: in chunks of `chunk_rows` rows (0: 16 MB of fp32), or by
// dstrain's kernel where `cuda_kernel` allows it.
struct LossRows {
  int64_t chunk_rows = 0;
  bool cuda_kernel = true;
};

// The loss of each row of `logits` [N, V] (fp32 [N]). With `gradient`, each row of logits is
// overwritten with its softmax minus the one-hot target: the loss's gradient, up to a scalar.
torch::Tensor row_losses(torch::Tensor& logits, const torch::Tensor& targets, const LossRows& how, bool gradient) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  torch::Tensor losses = torch::empty({rows}, logits.options().dtype(torch::kFloat32));
#ifdef DSTRAIN_WITH_CUDA_KERNELS
  // On a GPU: one kernel, one block a row, no fp32 copies (src/model/cuda/softmax_cross_entropy.cu).
  if (how.cuda_kernel && cuda::element_of(logits) && logits.stride(1) == 1 && targets.scalar_type() == torch::kInt64 &&
      targets.device() == logits.device()) {
    const c10::cuda::CUDAGuard guard(logits.device());
    const torch::Tensor dense_targets = targets.contiguous();
    C10_CUDA_CHECK(cuda::softmax_cross_entropy(logits.data_ptr(), *cuda::element_of(logits), rows, vocab,
                                               logits.stride(0), dense_targets.data_ptr<int64_t>(),
                                               losses.data_ptr<float>(), gradient, cuda::stream_of(logits)));
    return losses;
  }
#endif
  const int64_t chunk =
      how.chunk_rows > 0 ? how.chunk_rows : std::max<int64_t>(1, kLossChunkElements / std::max<int64_t>(vocab, 1));
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t n = std::min(chunk, rows - start);
    torch::Tensor part = logits.narrow(0, start, n);
    torch::Tensor index = targets.narrow(0, start, n).unsqueeze(1);
    torch::Tensor log_probs = torch::log_softmax(part, -1, torch::kFloat32);
    torch::Tensor target_log_probs = log_probs.gather(1, index);  // [n, 1]
    torch::Tensor part_losses = losses.narrow(0, start, n);
    torch::neg_out(part_losses, target_log_probs.squeeze(1));
    if (!gradient) continue;
    torch::exp_out(part, log_probs);  // one pass: fp32 in, the logits' dtype out
    // softmax − 1 at the target, from the fp32 log-probability (exp(lp) − 1 = expm1(lp)).
    part.scatter_(1, index, torch::expm1(target_log_probs).to(part.scalar_type()));
  }
  return losses;
}

// t × scale, a new tensor of t's dtype. A 16-bit tensor is scaled in fp32: times a 0-dim fp32
// tensor directly it would round the scale to 16 bits first, a bias shared by every element.
torch::Tensor scaled(const torch::Tensor& t, const torch::Tensor& scale) {
  const torch::ScalarType dtype = t.scalar_type();
  if (dtype != torch::kBFloat16 && dtype != torch::kHalf) return t * scale;
  return t.to(torch::kFloat32).mul_(scale).to(dtype);
}

class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, const LossRows& how) {
    torch::Tensor rows = hidden.reshape({-1, hidden.size(-1)});
    torch::Tensor logits = torch::mm(rows, weight.t());
    torch::Tensor losses = row_losses(logits, targets.reshape({-1}), how, /*gradient=*/true);
    ctx->save_for_backward({rows, weight, /*the logits' gradient, unscaled*/ logits});
    ctx->saved_data["hidden_shape"] = hidden.sizes().vec();
    return losses.mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &rows = saved[0], &weight = saved[1], &logit_grad = saved[2];
    // d mean / d logits = (softmax − onehot) / N, times the incoming gradient.
    const torch::Tensor scale = grad_outputs[0].to(torch::kFloat32) / static_cast<double>(rows.size(0));
    torch::Tensor grad_hidden, grad_weight;
    if (ctx->needs_input_grad(0))
      grad_hidden = scaled(torch::mm(logit_grad, weight), scale).view(ctx->saved_data["hidden_shape"].toIntVector());
    if (ctx->needs_input_grad(1)) grad_weight = weight_gradient(weight, logit_grad, scaled(rows, scale));
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor()};
  }

 private:
  // logit_grad^T × rows: the head weight's gradient, [vocabulary, hidden], the largest tensor a
  // backward pass makes. Where the weight already has a gradient of that dtype that autograd would
  // add this one into (the gradient buffer's view of it, optim/grad_buffer.h), the product is
  // added there directly and none is returned, so that no second [vocabulary, hidden] tensor is
  // made (Megatron-LM's gradient-accumulation fusion). Autograd still runs the weight's
  // accumulator, and its hooks, with no gradient.
  static torch::Tensor weight_gradient(const torch::Tensor& weight, const torch::Tensor& logit_grad,
                                       const torch::Tensor& rows) {
    torch::Tensor home = weight.grad();
    if (!home.defined() || home.scalar_type() != logit_grad.scalar_type() || home.device() != logit_grad.device() ||
        home.sizes() != weight.sizes())
      return torch::mm(logit_grad.t(), rows);
    torch::NoGradGuard no_grad;
    home.addmm_(logit_grad.t(), rows);
    return torch::Tensor();
  }
};

}  // namespace

torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& targets, int64_t chunk_rows, bool cuda_kernel) {
  const LossRows how{chunk_rows, cuda_kernel};
  if (targets.numel() * hidden.size(-1) != hidden.numel())
    throw std::invalid_argument("linear_cross_entropy: " + std::to_string(targets.numel()) + " targets for " +
                                std::to_string(hidden.numel() / std::max<int64_t>(hidden.size(-1), 1)) + " rows");
  const bool training = torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (training && hidden.scalar_type() == torch::kHalf) {
    // fp16 cannot hold the many probabilities of a large vocabulary below 6e-8, unscaled; the
    // autograd graph of log_softmax + nll_loss scales them by the loss scale before rounding.
    torch::Tensor logits = torch::matmul(hidden, weight.t());
    return torch::nll_loss(torch::log_softmax(logits.reshape({-1, logits.size(-1)}), -1, torch::kFloat32),
                           targets.reshape({-1}));
  }
  if (training) return LinearCrossEntropy::apply(hidden, weight, targets, how);
  // Evaluation: the losses alone, no gradient written.
  torch::Tensor logits = torch::mm(hidden.reshape({-1, hidden.size(-1)}), weight.t());
  return row_losses(logits, targets.reshape({-1}), how, /*gradient=*/false).mean();
}

}  // namespace dstrain
