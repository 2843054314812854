// FP8 training on GPUs. Quantization there gives the CPU's codes and scales. The products on
// LibTorch's FP8 kernel (model/fp8_matmul.h) match the emulation (model/fp8_products.h) on the
// same quantized operands, for every recipe, at the shapes of the 1B preset's and V2-Lite's linear
// maps: the kernel's bf16 result within 1e-3 (relative, Frobenius) of the emulation's rounded to
// bf16. Each shape must take the kernel: a refusal, or a fallback after LibTorch threw, fails the
// test rather than comparing the emulation with itself.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/model/fp8_matmul.h"
#include "dstrain/model/fp8_products.h"
#include "dstrain/model/fp8_projection.h"

using namespace dstrain;

namespace {

const std::vector<Fp8Recipe> kRecipes = {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise};

struct LinearShape {
  const char* name;
  int64_t in, out;
};

// The linear maps of the 1B preset (input/deepseek-llm-1b.ini) and of V2-Lite's MLA and experts;
// K = 5,504 (43 blocks of 128) is where the unpadded block scales went wrong.
const std::vector<LinearShape> kShapes = {
    {"1B q/k/v/o", 2048, 2048},     {"1B gate/up", 2048, 5504},        {"1B down", 5504, 2048},
    {"V2-Lite q", 2048, 3072},      {"V2-Lite kv_a (576 = 4.5 blocks)", 2048, 576},
    {"V2-Lite kv_b", 512, 4096},    {"V2-Lite expert gate/up", 2048, 1408}, {"V2-Lite expert down", 1408, 2048},
};

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const torch::Tensor g = got.to(torch::kFloat64), w = want.to(torch::kFloat64);
  return ((g - w).norm() / w.norm()).item<double>();
}

std::string recipe_name(Fp8Recipe recipe) { return name_of(fp8_recipe_names(), recipe); }

class GpuFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (accel::device_count() == 0) GTEST_SKIP() << "no GPU on this machine";
    if (!fp8_matmul_built()) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no FP8 product (2.10 and later)";
    if (accel::compute_capability(0) < 89) GTEST_SKIP() << "this GPU has no FP8 tensor cores";
  }
};

// One product on the kernel and emulated; the kernel must have taken it.
void expect_kernel_matches_emulation(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Matmul& kernel,
                                     const std::string& what) {
  ASSERT_EQ(fp8_matmul_refusal(a, b), "") << what;
  const torch::Tensor got = fp8_product(a, b, &kernel);
  ASSERT_FALSE(kernel.refused()) << what;
  ASSERT_EQ(got.scalar_type(), torch::kBFloat16) << what << ": the emulation's float32, not the kernel's bf16";
  const torch::Tensor want = fp8_product(a, b, nullptr).to(torch::kBFloat16);
  EXPECT_LE(relative_error(got, want), 1e-3) << what;
}

}  // namespace

// Quantization on the GPU (core's kernel where built, else LibTorch's operations there) gives the
// codes and scales the CPU's operations give: every tiling, partial tiles, a zero row, values over
// many magnitudes, an infinity and a NaN, from fp32, bf16 and fp16.
TEST_F(GpuFp8, QuantizationOnTheGpuGivesTheCpusCodesAndScales) {
  torch::manual_seed(10);
  torch::Tensor x = torch::randn({300, 520}) * torch::exp(torch::randn({300, 1}) * 4);
  x[7].zero_();
  x[20][30] = std::numeric_limits<float>::infinity();
  x[250][500] = std::numeric_limits<float>::quiet_NaN();
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf})
    for (Fp8Tile tile : std::vector<Fp8Tile>{{0, 0}, {1, 0}, {0, 1}, {1, 128}, {128, 1}, {128, 128}}) {
      const std::string what = std::string(c10::toString(dtype)) + ", tile " + std::to_string(tile.rows) + "x" +
                               std::to_string(tile.cols);
      const torch::Tensor values = x.to(dtype);
      const Fp8Tensor gpu = fp8_quantize(values.to(torch::kCUDA), tile), cpu = fp8_quantize(values, tile);
      EXPECT_TRUE(torch::equal(gpu.codes.view(torch::kUInt8).cpu(), cpu.codes.view(torch::kUInt8))) << what;
      const torch::Tensor gpu_scales = gpu.scales.cpu();
      EXPECT_TRUE(torch::equal(torch::isnan(gpu_scales), torch::isnan(cpu.scales))) << what;
      EXPECT_TRUE(torch::equal(torch::nan_to_num(gpu_scales), torch::nan_to_num(cpu.scales))) << what;
    }
}

TEST_F(GpuFp8, EveryProductOfEveryRecipeMatchesTheEmulationAtThePresetsShapes) {
  if (accel::compute_capability(0) / 10 != 9) GTEST_SKIP() << "blockwise tiles run on compute capability 9.x only";
  torch::manual_seed(11);
  const auto bf16 = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const int64_t tokens = 4096;
  Fp8Matmul kernel;
  for (Fp8Recipe recipe : kRecipes)
    for (const LinearShape& shape : kShapes) {
      const Fp8Tiling tiling = fp8_tiling(recipe);
      const std::string what = recipe_name(recipe) + ", " + shape.name;
      const torch::Tensor x = torch::randn({tokens, shape.in}, bf16);
      const torch::Tensor w = torch::randn({shape.out, shape.in}, bf16) * 0.02;
      const torch::Tensor dy = torch::randn({tokens, shape.out}, bf16) * 1e-3;
      const Fp8Tensor kept = fp8_quantize(x, tiling.input);
      // The three products' operands as fp8_products.cpp forms them.
      expect_kernel_matches_emulation(kept, fp8_quantize(w, tiling.weight), kernel, what + ", forward");
      expect_kernel_matches_emulation(fp8_quantize(dy, tiling.output_grad),
                                      fp8_transposed(fp8_quantize(w, tiling.weight_for_input_grad)), kernel,
                                      what + ", input gradient");
      expect_kernel_matches_emulation(fp8_transposed(fp8_quantize(dy, tiling.output_grad_for_weight)),
                                      fp8_transposed(fp8_quantize(x, tiling.input_for_weight)), kernel,
                                      what + ", weight gradient");
    }
}

// The grouped kernel (one scale a row) against each expert's product emulated: rowwise operands,
// and tensorwise ones whose scale it repeats down the rows, with an expert without rows.
TEST_F(GpuFp8, TheGroupedKernelComputesEachExpertsProduct) {
  if (accel::compute_capability(0) / 10 != 9) GTEST_SKIP() << "the grouped FP8 kernel runs on compute capability 9.x";
  torch::manual_seed(13);
  const auto bf16 = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const std::vector<int64_t> counts = {100, 0, 1, 256, 37};
  for (Fp8Tile tile : std::vector<Fp8Tile>{{0, 0}, {1, 0}}) {
    std::vector<Fp8Tensor> a(counts.size()), b(counts.size());
    std::vector<torch::Tensor> expected;
    for (size_t e = 0; e < counts.size(); ++e) {
      if (counts[e] > 0) a[e] = fp8_quantize(torch::randn({counts[e], 2048}, bf16), tile);
      b[e] = fp8_quantize(torch::randn({1408, 2048}, bf16) * 0.02, tile);
      if (counts[e] > 0) expected.push_back(fp8_product(a[e], b[e], nullptr).to(torch::kBFloat16));
    }
    Fp8Matmul kernel;
    ASSERT_TRUE(kernel.groups(b[0].codes));
    const torch::Tensor got = kernel.grouped(a, b);
    ASSERT_FALSE(kernel.grouped_refused());
    ASSERT_TRUE(got.defined()) << "the grouped kernel did not take tiles " << tile.rows << "x" << tile.cols;
    EXPECT_LE(relative_error(got, torch::cat(expected)), 1e-3) << tile.rows << "x" << tile.cols;
  }
}

// Routed experts through fp8_grouped_projection, forward and backward, on the kernels against the
// emulation: row counts of no multiple of 16 (the weight gradient's K), one row, and an expert
// without rows. Where the grouped kernel computes them (Hopper), blockwise experts take rowwise
// scales, so the emulation compared is rowwise's.
TEST_F(GpuFp8, ExpertsWithAnyNumberOfRowsMatchTheEmulation) {
  torch::manual_seed(12);
  const auto bf16 = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const std::vector<int64_t> counts = {100, 0, 1, 256, 37};
  const int64_t rows = 394, in = 2048, out = 1408, experts = static_cast<int64_t>(counts.size());
  const bool hopper = accel::compute_capability(0) / 10 == 9;
  for (Fp8Recipe recipe : kRecipes) {
    if (recipe == Fp8Recipe::kBlockwise && !hopper) continue;
    const torch::Tensor x = torch::randn({rows, in}, bf16), dy = torch::randn({rows, out}, bf16) * 1e-3;
    const torch::Tensor stack = torch::randn({experts, out, in}, bf16) * 0.02;
    auto run = [&](Fp8Recipe r, Fp8Matmul* kernel) {
      Fp8WeightCache cache;
      const torch::Tensor xi = x.clone().requires_grad_(), wi = stack.clone().requires_grad_();
      const torch::Tensor y = fp8_grouped_projection(xi, wi, counts, {r, &cache, nullptr, nullptr, kernel});
      y.backward(dy);
      return std::vector<torch::Tensor>{y.detach(), xi.grad(), wi.grad()};
    };
    Fp8Matmul kernel;
    const std::vector<torch::Tensor> got = run(recipe, &kernel);
    const Fp8Recipe emulated = hopper && recipe == Fp8Recipe::kBlockwise ? Fp8Recipe::kRowwise : recipe;
    const std::vector<torch::Tensor> want = run(emulated, nullptr);
    const std::string what = recipe_name(recipe);
    ASSERT_FALSE(kernel.refused()) << what;
    ASSERT_FALSE(kernel.grouped_refused()) << what;
    EXPECT_LE(relative_error(got[0], want[0].to(torch::kBFloat16)), 1e-3) << what << ", output";
    EXPECT_LE(relative_error(got[1], want[1].to(torch::kBFloat16)), 1e-3) << what << ", input gradient";
    EXPECT_LE(relative_error(got[2], want[2].to(torch::kBFloat16)), 1e-3) << what << ", weight gradient";
    EXPECT_EQ(got[2].select(0, 1).abs().max().item<float>(), 0.0f) << what << ": the expert without rows";
  }
}
