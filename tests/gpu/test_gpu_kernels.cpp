// dstrain's own CUDA kernels (src/model/cuda), reached through the functions that use them,
// against fp64 arithmetic on the CPU from the same rounded inputs. In a build without the kernels
// these check LibTorch's operations on the GPU instead, against the same references.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/model/grouped_matmul.h"
#include "dstrain/model/grouped_projection.h"
#include "dstrain/model/linear_cross_entropy.h"
#include "dstrain/model/rope.h"
#include "dstrain/model/swiglu_activation.h"

using namespace dstrain;

namespace {

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kCPU, torch::kFloat64) - want.to(torch::kFloat64)).norm() / want.norm()).item<double>();
}

// Rounding to `dtype` and back: the values the GPU computes from.
torch::Tensor rounded(const torch::Tensor& t, torch::ScalarType dtype) { return t.to(dtype).to(torch::kFloat64); }

class GpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (accel::device_count() == 0) GTEST_SKIP() << "no GPU on this machine";
  }
};

}  // namespace

// The loss, and the gradients that the logits' gradient written over the logits gives, for a
// vocabulary whose rows the kernel reads in 16-byte packs (32000) and one whose rows start off
// that boundary (4099, an odd row stride), over logits spread wide enough (±~15) that the online
// maximum changes along the row.
TEST_F(GpuKernels, LossAndGradientsOfTheHeadEqualTheMaterialisedSoftmax) {
  torch::manual_seed(5);
  for (int64_t vocab : {32000, 4099}) {
    // fp16 trains through LibTorch's graph (see linear_cross_entropy.h) and evaluates with the kernel.
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
      const int64_t rows = 48, width = 64;
      torch::Tensor hidden = torch::randn({2, rows / 2, width}, torch::kFloat64);
      torch::Tensor weight = torch::randn({vocab, width}, torch::kFloat64) * 0.6;
      torch::Tensor targets = torch::randint(vocab, {2, rows / 2}, torch::kInt64);
      torch::Tensor h = hidden.to(torch::kCUDA, dtype).requires_grad_();
      torch::Tensor w = weight.to(torch::kCUDA, dtype).requires_grad_();
      torch::Tensor loss = linear_cross_entropy(h, w, targets.to(torch::kCUDA));
      loss.backward();

      torch::Tensor h64 = rounded(hidden, dtype).requires_grad_(), w64 = rounded(weight, dtype).requires_grad_();
      torch::Tensor logits = torch::matmul(h64, w64.t()).reshape({rows, vocab});
      // The reference's logits are the GPU product's, whose bf16 rounding moves each by up to ~0.03.
      torch::Tensor gpu_logits = torch::mm(h.detach().reshape({rows, width}), w.detach().t()).to(torch::kCPU, torch::kFloat64);
      logits = logits + (gpu_logits - logits).detach();
      torch::Tensor expected = torch::nll_loss(torch::log_softmax(logits, -1), targets.reshape({-1}));
      expected.backward();

      const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 1e-2;
      EXPECT_NEAR(loss.item<double>(), expected.item<double>(), expected.item<double>() * 1e-5) << vocab << " " << dtype;
      EXPECT_LT(relative_error(h.grad(), h64.grad()), tolerance) << vocab << " " << dtype;
      EXPECT_LT(relative_error(w.grad(), w64.grad()), tolerance) << vocab << " " << dtype;

      torch::NoGradGuard evaluation;  // the losses alone, without writing a gradient
      EXPECT_NEAR(linear_cross_entropy(h, w, targets.to(torch::kCUDA)).item<double>(), expected.item<double>(),
                  expected.item<double>() * 1e-5)
          << vocab << " " << dtype;
    }
  }
}

// A row whose logits are all −inf but the target's still has a finite loss (0): the online
// softmax must not subtract −inf from −inf. A NaN logit anywhere in a row makes its loss NaN, as
// LibTorch's does (the trainer's check of the loss is what catches a model gone bad).
TEST_F(GpuKernels, InfiniteLogitsDropOutOfTheSoftmaxAndNaNsReachTheLoss) {
  const int64_t vocab = 1000;
  torch::Tensor weight = torch::zeros({vocab, 2}, torch::kFloat32);
  weight.index_put_({torch::indexing::Slice(), 0}, -std::numeric_limits<float>::infinity());
  weight[17][0] = 1.0;
  torch::Tensor hidden = torch::tensor({{1.0f, 0.0f}});  // logits: −inf everywhere, 1 at token 17
  torch::Tensor targets = torch::tensor({17}, torch::kInt64);
  torch::NoGradGuard evaluation;
  torch::Tensor loss = linear_cross_entropy(hidden.cuda(), weight.cuda(), targets.cuda());
  EXPECT_NEAR(loss.item<double>(), 0.0, 1e-6);
  for (int64_t vocab_size : {257, 4096}) {  // element by element, and in 16-byte packs
    // Logits 0 but a NaN at token 3 (element by element, the first logit thread 3 sees); the
    // target's is finite.
    torch::Tensor weight_nan = torch::zeros({vocab_size, 1}, torch::kFloat32);
    weight_nan[3][0] = std::numeric_limits<float>::quiet_NaN();
    torch::Tensor one = torch::ones({1, 1}, torch::kFloat32).cuda();
    torch::Tensor loss_nan = linear_cross_entropy(one, weight_nan.cuda(), torch::tensor({100}, torch::kInt64).cuda());
    EXPECT_TRUE(std::isnan(loss_nan.item<double>())) << vocab_size;
  }
}

// A confident row: the target's logit 17.2 above 4095 others of 0, so that its loss and the
// target's gradient are log(1 + 4095 e^-17.2) ~ 1.39e-4, a sum of 1 and thousands of ~3.4e-8
// terms that an fp32 running sum of 1 would drop (~2% off over few threads).
TEST_F(GpuKernels, AConfidentRowKeepsItsSmallLossAndTargetGradient) {
#ifndef DSTRAIN_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without dstrain's CUDA kernels: LibTorch's fp32 sum loses this (~1%)";
#endif
  const int64_t vocab = 4096, target = 5;
  torch::Tensor weight = torch::zeros({vocab, 1}, torch::kFloat32);
  weight[target][0] = 17.2;
  torch::Tensor h = torch::ones({1, 1}, torch::kFloat32).cuda();
  torch::Tensor w = weight.cuda().requires_grad_();
  torch::Tensor loss = linear_cross_entropy(h, w, torch::tensor({target}, torch::kInt64).cuda());
  loss.backward();
  const double logit = static_cast<double>(17.2f);
  const double expected = std::log1p((vocab - 1) * std::exp(-logit));  // −log p(target)
  EXPECT_NEAR(loss.item<double>(), expected, expected * 2e-3);
  EXPECT_NEAR(w.grad()[target][0].item<double>(), std::expm1(-expected), expected * 2e-3);  // p − 1
}

// silu(gate) × up and both input gradients, contiguous (the fused kernels, with a count that
// leaves a tail after the 16-byte packs) and transposed (LibTorch's operations), in each dtype.
TEST_F(GpuKernels, SwigluActivationAndGradientsEqualTheFormula) {
  torch::manual_seed(9);
  torch::Tensor gate = torch::randn({3, 37, 101}, torch::kFloat64) * 4;
  torch::Tensor up = torch::randn({3, 37, 101}, torch::kFloat64);
  torch::Tensor upstream = torch::randn({3, 37, 101}, torch::kFloat64);
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    torch::Tensor g64 = rounded(gate, dtype).requires_grad_(), u64 = rounded(up, dtype).requires_grad_();
    torch::Tensor expected = g64 * torch::sigmoid(g64) * u64;
    expected.backward(rounded(upstream, dtype));
    // One rounding of an fp32 result in fp32; bf16 keeps 8 bits, fp16 11.
    const double tolerance = dtype == torch::kFloat32 ? 1e-6 : dtype == torch::kBFloat16 ? 8e-3 : 1e-3;
    for (bool transposed : {false, true}) {
      // Leaves in the layout given; transposed, the activation sees non-contiguous views of them.
      auto leaf = [&](const torch::Tensor& t) {
        torch::Tensor l = (transposed ? t.transpose(1, 2).contiguous() : t).to(torch::kCUDA, dtype);
        return l.requires_grad_();
      };
      auto as_given = [&](const torch::Tensor& t) { return transposed ? t.transpose(1, 2) : t; };
      torch::Tensor g = leaf(gate), u = leaf(up);
      torch::Tensor out = swiglu_activation(as_given(g), as_given(u));
      out.backward(upstream.to(torch::kCUDA, dtype));
      EXPECT_EQ(out.scalar_type(), dtype);
      EXPECT_LT(relative_error(out, expected), tolerance) << dtype << " transposed " << transposed;
      // LibTorch's graph rounds silu(gate) before the product: one rounding more.
      const double grad_tolerance = transposed ? 2 * tolerance : tolerance;
      EXPECT_LT(relative_error(as_given(g.grad()), g64.grad()), grad_tolerance) << dtype << " transposed " << transposed;
      EXPECT_LT(relative_error(as_given(u.grad()), u64.grad()), grad_tolerance) << dtype << " transposed " << transposed;
    }
  }
}

// The rotation and its gradient in both pair layouts, on the layouts attention gives it: heads
// transposed out of [batch, seq, heads, head_dim] (q and k), and a slice of the last dimension
// (MLA's rotary part), at positions from 0 and from 5 (cached decoding), in each dtype.
TEST_F(GpuKernels, RopeAndItsGradientEqualTheRotationInFp64) {
  torch::manual_seed(13);
  const int64_t batch = 2, seq = 9, heads = 3, head_dim = 64;
  torch::Tensor input = torch::randn({batch, seq, heads, head_dim + 16}, torch::kFloat64);
  torch::Tensor upstream = torch::randn({batch, heads, seq, head_dim}, torch::kFloat64);
  for (bool interleave : {false, true}) {
    const RopeTables all = make_rope_tables(32, head_dim, 10000.0, interleave);
    for (int64_t first : {0, 5}) {
      const RopeTables tables = rope_tables_from(all, first, seq);
      const RopeTables gpu_tables{tables.cos.cuda(), tables.sin.cuda(), interleave};
      for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
        const std::string what = std::string(interleave ? "interleaved" : "half-split") + " from " +
                                 std::to_string(first) + " " + c10::toString(dtype);
        torch::Tensor x64 = input.to(dtype).to(torch::kFloat64).requires_grad_();
        torch::Tensor expected = apply_rope(x64.narrow(-1, 16, head_dim).transpose(1, 2), tables);
        expected.backward(upstream.to(dtype).to(torch::kFloat64));

        torch::Tensor x = input.to(torch::kCUDA, dtype).requires_grad_();
        torch::Tensor got = apply_rope(x.narrow(-1, 16, head_dim).transpose(1, 2), gpu_tables);
        got.backward(upstream.to(torch::kCUDA, dtype));
        const double tolerance = dtype == torch::kFloat32 ? 1e-6 : dtype == torch::kBFloat16 ? 8e-3 : 2e-3;
        EXPECT_EQ(got.scalar_type(), dtype) << what;
        EXPECT_LT(relative_error(got, expected), tolerance) << what;
        EXPECT_LT(relative_error(x.grad(), x64.grad()), tolerance) << what;
        // The first 16 of the last dimension are no part of the rotation: no gradient.
        EXPECT_EQ(x.grad().narrow(-1, 0, 16).abs().max().item<double>(), 0.0) << what;
      }
    }
  }
}

// The routed experts' products as LibTorch's grouped kernel computes them (model/grouped_matmul.h,
// LibTorch 2.8 and later) against the per-expert loop in fp64 from the same bf16 values: the
// output, the rows' gradient and every expert's weight gradient, for groups of uneven sizes (31
// rows in all, no multiple of 8) and an expert without rows, whose weight gradient must be zero.
TEST_F(GpuKernels, GroupedExpertProductsEqualTheLoopInFp64) {
  if (!DSTRAIN_TORCH_AT_LEAST(2, 8)) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no grouped product";
  torch::manual_seed(17);
  const std::vector<int64_t> counts = {5, 0, 11, 15};
  const int64_t rows = 31, in = 64, out = 48;
  const torch::Tensor input = torch::randn({rows, in}, torch::kFloat64);
  const torch::Tensor weights = torch::randn({4, out, in}, torch::kFloat64) * 0.2;
  const torch::Tensor upstream = torch::randn({rows, out}, torch::kFloat64);
  const torch::ScalarType bf16 = torch::kBFloat16;

  torch::Tensor x = input.to(torch::kCUDA, bf16).requires_grad_(), w = weights.to(torch::kCUDA, bf16).requires_grad_();
  ASSERT_TRUE(grouped_matmul_applies(x, w.transpose(1, 2)));     // forward
  const torch::Tensor grad_out = upstream.to(torch::kCUDA, bf16);
  ASSERT_TRUE(grouped_matmul_applies(grad_out.t(), x.detach()));  // the weight gradient's
  GroupedMatmul grouped;
  torch::Tensor got = grouped_projection(x, w, counts, &grouped);
  got.backward(grad_out);
  EXPECT_FALSE(grouped.refused()) << "a grouped product failed, and the loop computed instead";

  torch::Tensor x64 = rounded(input, bf16).requires_grad_(), w64 = rounded(weights, bf16).requires_grad_();
  torch::Tensor expected = grouped_projection(x64, w64, counts);  // on the CPU: the loop
  expected.backward(rounded(upstream, bf16));
  EXPECT_LT(relative_error(got, expected), 1e-2);
  EXPECT_LT(relative_error(x.grad(), x64.grad()), 1e-2);
  for (int64_t e : {0, 2, 3})
    EXPECT_LT(relative_error(w.grad()[e], w64.grad()[e]), 1e-2) << "expert " << e;
  EXPECT_EQ(w.grad()[1].abs().max().item<double>(), 0.0) << "the expert without rows";
}
