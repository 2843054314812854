// The fused LM-head loss on the GPU in the 16-bit dtypes, against fp64 arithmetic on the same
// 16-bit values (the CPU build of LibTorch 1.13 has no fp16 matrix product to check fp16 with).
#include <gtest/gtest.h>

#include "dstrain/core/accelerator.h"
#include "dstrain/model/linear_cross_entropy.h"

using namespace dstrain;

namespace {

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kCPU, torch::kFloat64) - want).norm() / want.norm()).item<double>();
}

}  // namespace

// Confident rows over a 4096-token vocabulary: every other token has probability ~3e-8, below
// fp16's smallest subnormal (6e-8). Their share of the weight gradient is all those rows' weight
// gradient has: bf16 (the fused function) holds it, fp16 (log_softmax + nll_loss) only once the
// loss scale, here fp16's default, has lifted it into range.
TEST(GpuLoss, SixteenBitGradientsKeepTheSmallProbabilities) {
  if (accel::device_count() == 0) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(11);
  constexpr double kLossScale = 65536.0;
  const int64_t vocab = 4096, width = 64, rows = 4;
  torch::Tensor weight = torch::randn({vocab, width}, torch::kFloat64) * 0.01;
  torch::Tensor hidden = torch::zeros({1, rows, width}, torch::kFloat64);
  torch::Tensor targets = torch::tensor({{7, 1000, 2222, 4000}}, torch::kInt64);
  for (int64_t r = 0; r < rows; ++r) {
    weight[targets[0][r].item<int64_t>()][r] += 4.0;
    hidden[0][r][r] = 4.3;  // target logit ~17.2, the others ~0: p ~ e^-17.2 ~ 3e-8
  }
  for (torch::ScalarType dtype : {torch::kHalf, torch::kBFloat16}) {
    torch::Tensor h = hidden.to(torch::kCUDA, dtype).requires_grad_();
    torch::Tensor w = weight.to(torch::kCUDA, dtype).requires_grad_();
    // The reference: fp64 from the same rounded values and from the logits the 16-bit matrix
    // product gives (a logit of 17 is ±0.03 off in bf16: ±3% on every probability).
    torch::Tensor h64 = hidden.to(dtype).to(torch::kFloat64).requires_grad_();
    torch::Tensor w64 = weight.to(dtype).to(torch::kFloat64).requires_grad_();
    torch::Tensor logits = torch::matmul(h64, w64.t()).reshape({rows, vocab});
    torch::Tensor rounded = torch::mm(h.detach().reshape({rows, width}), w.detach().t()).to(torch::kCPU, torch::kFloat64);
    logits = logits + (rounded - logits).detach();
    torch::Tensor expected = torch::nll_loss(torch::log_softmax(logits, -1), targets.reshape({-1}));
    (expected * kLossScale).backward();
    torch::Tensor loss = linear_cross_entropy(h, w, targets.to(torch::kCUDA));
    (loss * kLossScale).backward();
    // The small probabilities are the weight gradient's rows of the tokens that are no target
    // (the targets' rows, checked in tests/unit against the materialised logits, would dominate
    // a norm over all rows; so does a row's target in the hidden gradient).
    torch::Tensor others = torch::ones({vocab}, torch::kBool).index_fill_(0, targets.reshape({-1}), false);
    EXPECT_LT(relative_error(w.grad().index({others.to(torch::kCUDA)}), w64.grad().index({others})), 0.02) << dtype;
  }
}
