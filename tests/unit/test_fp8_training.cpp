// FP8 training (train.fp8): the tiled quantizer and the three products of a linear map, for every
// recipe, against fp64 computations of the test's own (the E4M3 encoder of e4m3_reference.h, the
// tiles and scales by loops), on shapes that leave partial tiles.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "dstrain/core/torch_compat.h"
#include "dstrain/model/fp8_matmul.h"
#include "dstrain/model/grouped_experts.h"
#include "dstrain/model/fp8_products.h"
#include "dstrain/model/fp8_projection.h"
#include "dstrain/core/fp8_quantization.h"
#include "dstrain/model/fp8_recipe.h"
#include "e4m3_reference.h"

using namespace dstrain;
using dstrain::test::formula;
using dstrain::test::reference_code;

namespace {

const std::vector<Fp8Recipe> kRecipes = {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise};

int64_t edge(int64_t asked, int64_t size) { return asked > 0 ? asked : size; }

// What `x` (float32, 2-D) quantized in `tile` stands for, in fp64: each tile's scale is
// float(largest magnitude / 448) (1 for a zero tile), each element the E4M3 value nearest the
// float32 quotient element / scale, times the scale, rounded to float32 as the dequantized tensor is.
struct Reference {
  torch::Tensor values;  // float64 [rows, cols]
  torch::Tensor scales;  // float32 [row tiles, col tiles]
};

Reference reference_quantized(const torch::Tensor& x, Fp8Tile tile) {
  const torch::Tensor in = x.to(torch::kFloat32).contiguous();
  const int64_t rows = in.size(0), cols = in.size(1);
  const int64_t tr = edge(tile.rows, rows), tc = edge(tile.cols, cols);
  const int64_t row_tiles = (rows + tr - 1) / tr, col_tiles = (cols + tc - 1) / tc;
  auto a = in.accessor<float, 2>();
  Reference ref{torch::empty({rows, cols}, torch::kFloat64), torch::empty({row_tiles, col_tiles}, torch::kFloat32)};
  auto v = ref.values.accessor<double, 2>();
  auto s = ref.scales.accessor<float, 2>();
  for (int64_t i = 0; i < row_tiles; ++i)
    for (int64_t j = 0; j < col_tiles; ++j) {
      double largest = 0;
      bool finite = true;
      for (int64_t r = i * tr; r < std::min(rows, (i + 1) * tr); ++r)
        for (int64_t c = j * tc; c < std::min(cols, (j + 1) * tc); ++c) {
          finite = finite && std::isfinite(a[r][c]);
          largest = std::max(largest, std::fabs(static_cast<double>(a[r][c])));
        }
      const float scale = !finite ? std::numeric_limits<float>::quiet_NaN()
                          : largest == 0 ? 1.0f
                                         : static_cast<float>(largest / 448.0);
      s[i][j] = scale;
      for (int64_t r = i * tr; r < std::min(rows, (i + 1) * tr); ++r)
        for (int64_t c = j * tc; c < std::min(cols, (j + 1) * tc); ++c) {
          const float quotient = a[r][c] / scale;
          const double value = formula(reference_code(quotient)) * static_cast<double>(scale);
          v[r][c] = !finite ? std::numeric_limits<double>::quiet_NaN() : static_cast<double>(static_cast<float>(value));
        }
    }
  return ref;
}

torch::Tensor reference_values(const torch::Tensor& x, Fp8Tile tile) { return reference_quantized(x, tile).values; }

// Equal, NaN where the other is NaN.
void expect_same_values(const torch::Tensor& got, const torch::Tensor& expected, const std::string& what) {
  const torch::Tensor g = got.to(torch::kFloat64), e = expected.to(torch::kFloat64);
  ASSERT_EQ(g.sizes(), e.sizes()) << what;
  EXPECT_TRUE(torch::equal(torch::isnan(g), torch::isnan(e))) << what;
  const torch::Tensor finite = ~torch::isnan(e);
  EXPECT_TRUE(torch::equal(g.masked_select(finite), e.masked_select(finite))) << what;
}

// `got` (an fp32 product a·b over k terms) within fp32 rounding of the fp64 `exact`: each element
// off by at most 2k·2^-24 times the sum of its terms' magnitudes (`magnitudes` = |a|·|b|).
void expect_within_fp32_rounding(const torch::Tensor& got, const torch::Tensor& exact, const torch::Tensor& magnitudes,
                                 int64_t k, const std::string& what) {
  ASSERT_EQ(got.sizes(), exact.sizes()) << what;
  const torch::Tensor bound = magnitudes * (2.0 * static_cast<double>(k) * std::ldexp(1.0, -24)) + 1e-30;
  const torch::Tensor excess = ((got.to(torch::kFloat64) - exact).abs() - bound).max();
  EXPECT_LE(excess.item<double>(), 0.0) << what;
}

std::string name(Fp8Recipe recipe) { return name_of(fp8_recipe_names(), recipe); }

// A deferral that keeps what the backward pass hands it, as a zero-bubble schedule's W action would.
class KeptDeferral : public WeightGradientDeferral {
 public:
  bool deferring() const override { return true; }
  void defer(const torch::Tensor& weight, std::function<torch::Tensor()> gradient) override {
    weights.push_back(weight);
    gradients.push_back(std::move(gradient));
  }
  std::vector<torch::Tensor> weights;
  std::vector<std::function<torch::Tensor()>> gradients;
};

}  // namespace

TEST(Fp8Quantization, EveryTilingMatchesAnFp64Reference) {
  torch::manual_seed(3);
  // 130 × 300: partial tiles along both dimensions for 128-long tiles; outliers spread the scales.
  torch::Tensor x = torch::randn({130, 300}) * 3;
  x.index_put_({5, 7}, 900.0f);
  x.index_put_({129, 299}, -2e-3f);
  x.narrow(0, 0, 1).narrow(1, 128, 128).zero_();  // a zero tile for 1×128
  for (Fp8Tile tile : std::vector<Fp8Tile>{{0, 0}, {1, 0}, {0, 1}, {1, 128}, {128, 1}, {128, 128}, {7, 50}}) {
    const std::string what = "tile " + std::to_string(tile.rows) + "x" + std::to_string(tile.cols);
    const Fp8Tensor q = fp8_quantize(x, tile);
    const Reference ref = reference_quantized(x, tile);
    EXPECT_EQ(q.codes.element_size(), 1) << what;  // a byte an element
    expect_same_values(q.scales, ref.scales, what + ": scales");
    expect_same_values(fp8_dequantize(q), ref.values, what + ": values");
  }
}

TEST(Fp8Quantization, RoundsToNearestEvenAndSaturatesAt448) {
  // Scale 1 (largest 448): the quotients are the values. Midpoints go to the even mantissa, among
  // subnormals (multiples of 2^-9) too.
  const std::vector<float> in = {448, 1.0625f, 1.1875f, -1.0625f, std::ldexp(1.0f, -10), 3 * std::ldexp(1.0f, -10)};
  const std::vector<float> out = {448, 1.0f, 1.25f, -1.0f, 0.0f, std::ldexp(1.0f, -8)};
  const Fp8Tensor q = fp8_quantize(torch::tensor(in).view({1, -1}), {0, 0});
  EXPECT_EQ(q.scales.item<float>(), 1.0f);
  expect_same_values(fp8_dequantize(q).view({-1}), torch::tensor(out), "ties");

  // A largest magnitude whose float32 quotient by its own scale exceeds 448 saturates to 448.
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(1.0f, 1000.0f);
  float over = 0;
  for (int i = 0; i < 100000 && over == 0; ++i) {
    const float a = uniform(random);
    if (a / (a / 448.0f) > 448.0f) over = a;
  }
  ASSERT_NE(over, 0.0f) << "no float whose quotient by its scale exceeds 448 found";
  const Fp8Tensor saturated = fp8_quantize(torch::tensor({over, -over}).view({1, 2}), {0, 0});
  const float scale = saturated.scales.item<float>();
  expect_same_values(fp8_dequantize(saturated).view({-1}), torch::tensor({448 * scale, -448 * scale}), "saturation");
}

TEST(Fp8Quantization, ZeroTilesAndATileOfOneHugeValue) {
  torch::Tensor x = torch::ones({2, 256}) * 0.5;
  x.narrow(1, 0, 128).select(0, 0).zero_();
  x.index_put_({1, 200}, 1e30f);
  const Fp8Tensor q = fp8_quantize(x, {1, 128});
  const torch::Tensor values = fp8_dequantize(q);
  EXPECT_EQ(q.scales[0][0].item<float>(), 1.0f);  // the zero tile
  EXPECT_TRUE(torch::equal(values[0].narrow(0, 0, 128), torch::zeros({128})));
  // Beside 1e30, 0.5 is far below the smallest subnormal step of its tile: it flushes to zero,
  // while the huge value keeps its own within E4M3's step.
  const float scale = q.scales[1][1].item<float>();
  EXPECT_EQ(scale, static_cast<float>(1e30f / 448.0f));
  EXPECT_EQ(values[1][200].item<float>(), 448 * scale);
  EXPECT_EQ(values[1].narrow(0, 128, 72).abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(values[1].narrow(0, 0, 128), torch::full({128}, 0.5)));  // its own tile: exact
}

TEST(Fp8Quantization, ANonFiniteValueMakesItsTileNaN) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    torch::Tensor x = torch::randn({2, 256});
    x.index_put_({0, 5}, bad);
    const torch::Tensor values = fp8_dequantize(fp8_quantize(x, {1, 128}));
    EXPECT_TRUE(torch::isnan(values[0].narrow(0, 0, 128)).all().item<bool>()) << bad;
    EXPECT_TRUE(torch::isfinite(values[0].narrow(0, 128, 128)).all().item<bool>()) << bad;
    EXPECT_TRUE(torch::isfinite(values[1]).all().item<bool>()) << bad;
  }
}

// The forward product, the input gradient and the weight gradient of every recipe are fp64
// products of the operands quantized as the recipe says (by the reference quantizer), within
// fp32 rounding. 150 tokens × 300 inputs → 130 outputs: partial 128-tiles everywhere.
TEST(Fp8Projection, ItsThreeProductsAreFp64ProductsOfTheQuantizedOperands) {
  torch::manual_seed(11);
  const torch::Tensor x0 = torch::randn({3, 50, 300}), w0 = torch::randn({130, 300}) * 0.05;
  const torch::Tensor dy = torch::randn({3, 50, 130});
  const torch::Tensor x2 = x0.view({-1, 300}), dy2 = dy.view({-1, 130});
  for (Fp8Recipe recipe : kRecipes) {
    const Fp8Tiling t = fp8_tiling(recipe);
    const torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    Fp8WeightCache cache;
    const torch::Tensor y = fp8_projection(x, w, {recipe, &cache, nullptr});
    y.backward(dy);

    const torch::Tensor xq = reference_values(x2, t.input), wq = reference_values(w0, t.weight);
    expect_within_fp32_rounding(y.view({-1, 130}), xq.mm(wq.t()), xq.abs().mm(wq.abs().t()), 300,
                                name(recipe) + ": y");
    const torch::Tensor dyq = reference_values(dy2, t.output_grad);
    const torch::Tensor wq_dx = reference_values(w0, t.weight_for_input_grad);
    expect_within_fp32_rounding(x.grad().view({-1, 300}), dyq.mm(wq_dx), dyq.abs().mm(wq_dx.abs()), 130,
                                name(recipe) + ": dx");
    // The weight gradient reads the input as kept (xq), quantized again in its own tiles.
    const torch::Tensor dyq_dw = reference_values(dy2, t.output_grad_for_weight);
    const torch::Tensor xq_dw =
        t.input_for_weight == t.input ? xq : reference_values(xq.to(torch::kFloat32), t.input_for_weight);
    expect_within_fp32_rounding(w.grad(), dyq_dw.t().mm(xq_dw), dyq_dw.abs().t().mm(xq_dw.abs()), 150,
                                name(recipe) + ": dW");

    // And FP8 is not the plain product: close to it, not equal.
    const torch::Tensor plain = x0.matmul(w0.t());
    const double relative = ((y - plain).norm() / plain.norm()).item<double>();
    EXPECT_GT(relative, 1e-4) << name(recipe);
    EXPECT_LT(relative, 0.1) << name(recipe);
  }
}

// The routed experts' products: each expert's the FP8 projection of its own rows, bitwise; an
// expert without rows gets a zero weight gradient.
TEST(Fp8Projection, GroupedExpertsComputeEachExpertsProjection) {
  torch::manual_seed(5);
  const std::vector<int64_t> counts = {5, 0, 140, 3};
  const torch::Tensor rows0 = torch::randn({148, 40}), stack0 = torch::randn({4, 24, 40}) * 0.1;
  const torch::Tensor dy = torch::randn({148, 24});
  for (Fp8Recipe recipe : kRecipes) {
    const torch::Tensor rows = rows0.clone().requires_grad_(true), stack = stack0.clone().requires_grad_(true);
    Fp8WeightCache cache;
    const torch::Tensor y = fp8_grouped_projection(rows, stack, counts, {recipe, &cache, nullptr});
    y.backward(dy);
    EXPECT_TRUE(torch::equal(stack.grad()[1], torch::zeros({24, 40}))) << name(recipe);
    int64_t start = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      if (n > 0) {
        const torch::Tensor x = rows0.narrow(0, start, n).clone().requires_grad_(true);
        const torch::Tensor w = stack0[e].clone().requires_grad_(true);
        Fp8WeightCache own;
        const torch::Tensor expected = fp8_projection(x, w, {recipe, &own, nullptr});
        expected.backward(dy.narrow(0, start, n));
        const std::string what = name(recipe) + ", expert " + std::to_string(e);
        EXPECT_TRUE(torch::equal(y.narrow(0, start, n), expected)) << what;
        EXPECT_TRUE(torch::equal(rows.grad().narrow(0, start, n), x.grad())) << what;
        EXPECT_TRUE(torch::equal(stack.grad()[e], w.grad())) << what;
      }
      start += n;
    }
  }
}

// Under a zero-bubble schedule the weight gradient goes to the deferral, equal to the one the
// backward pass computes at once; the input gradient comes at once either way.
TEST(Fp8Projection, ADeferredWeightGradientIsTheOneComputedAtOnce) {
  torch::manual_seed(2);
  const torch::Tensor x0 = torch::randn({2, 9, 64}), w0 = torch::randn({48, 64}) * 0.1, dy = torch::randn({2, 9, 48});
  for (Fp8Recipe recipe : kRecipes) {
    Fp8WeightCache cache;
    const torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    fp8_projection(x, w, {recipe, &cache, nullptr}).backward(dy);
    KeptDeferral deferral;
    const torch::Tensor x_late = x0.clone().requires_grad_(true), w_late = w0.clone().requires_grad_(true);
    fp8_projection(x_late, w_late, {recipe, &cache, &deferral}).backward(dy);
    EXPECT_FALSE(w_late.grad().defined()) << name(recipe);
    ASSERT_EQ(deferral.gradients.size(), 1u) << name(recipe);
    EXPECT_TRUE(deferral.weights[0].is_same(w_late)) << name(recipe);
    EXPECT_TRUE(torch::equal(deferral.gradients[0](), w.grad())) << name(recipe);
    EXPECT_TRUE(torch::equal(x_late.grad(), x.grad())) << name(recipe);
  }
}

// A weight is quantized once until it changes (once per optimizer step, not per micro-batch),
// and again as soon as it does.
TEST(Fp8WeightCache, QuantizesAgainOnlyWhenTheWeightChanges) {
  torch::Tensor w = torch::randn({16, 32}, torch::requires_grad());
  torch::Tensor stack = torch::randn({3, 16, 32}, torch::requires_grad());
  Fp8WeightCache cache;
  const Fp8Tile tile{1, 128};
  const Fp8Tensor first = cache.quantized(w, tile);
  cache.quantized(w, tile);
  cache.quantized(stack, 2, tile);
  cache.quantized(stack, 2, tile);
  EXPECT_EQ(cache.made(), 2);
  {
    torch::NoGradGuard no_grad;
    w.add_(1.0);  // as the optimizer updates in place
    stack[2].mul_(2.0);
  }
  expect_same_values(fp8_dequantize(cache.quantized(w, tile)), fp8_dequantize(fp8_quantize(w.detach(), tile)), "w");
  expect_same_values(fp8_dequantize(cache.quantized(stack, 2, tile)),
                     fp8_dequantize(fp8_quantize(stack.detach()[2], tile)), "expert 2");
  EXPECT_EQ(cache.made(), 4);
  EXPECT_FALSE(torch::equal(fp8_dequantize(first), fp8_dequantize(cache.quantized(w, tile))));
}

// Routed experts quantize each expert's gate, up and down weights once until they change, over any
// number of micro-batches: each stack has a cache of its own (a shared one had them take each
// other's place, quantizing every weight again at every use).
TEST(Fp8WeightCache, RoutedExpertsQuantizeTheirWeightsOncePerStep) {
  torch::manual_seed(6);
  const std::vector<int64_t> counts = {3, 0, 4, 1};
  ComputeOptions options;
  options.fp8 = Fp8Recipe::kBlockwise;
  GroupedExperts experts(4, 0, 32, 16, options);
  for (auto& parameter : experts->parameters()) parameter.data().normal_(0, 0.1);
  auto micro_batch = [&] { experts->forward(torch::randn({8, 32}, torch::requires_grad()), counts).sum().backward(); };
  micro_batch();
  // Forward and input gradient share the blockwise weight's 128×128 blocks: one quantization a
  // weight of each expert with rows.
  const int64_t per_step = 3 * 3;
  EXPECT_EQ(experts->fp8_quantizations(), per_step);
  micro_batch();
  micro_batch();
  EXPECT_EQ(experts->fp8_quantizations(), per_step);
  {
    torch::NoGradGuard no_grad;
    for (auto& parameter : experts->parameters()) parameter.add_(0.01);  // as the optimizer steps
  }
  micro_batch();
  EXPECT_EQ(experts->fp8_quantizations(), 2 * per_step);
}

// A rank that receives no rows for its experts still runs its products: no rows, no tiles.
TEST(Fp8Quantization, NoRowsAreNoTiles) {
  for (Fp8Tile tile : std::vector<Fp8Tile>{{0, 0}, {1, 0}, {0, 1}, {1, 128}, {128, 1}, {128, 128}}) {
    const Fp8Tensor q = fp8_quantize(torch::zeros({0, 40}), tile);
    EXPECT_EQ(q.codes.sizes(), torch::IntArrayRef({0, 40}));
    EXPECT_EQ(q.scales.numel(), 0);
    EXPECT_EQ(fp8_dequantize(q).sizes(), torch::IntArrayRef({0, 40}));
  }
  for (Fp8Recipe recipe : kRecipes) {
    Fp8WeightCache cache;
    const torch::Tensor x = torch::zeros({0, 40}, torch::requires_grad());
    const torch::Tensor w = torch::randn({24, 40}, torch::requires_grad());
    const torch::Tensor y = fp8_projection(x, w, {recipe, &cache, nullptr});
    EXPECT_EQ(y.sizes(), torch::IntArrayRef({0, 24})) << name(recipe);
    y.sum().backward();
    EXPECT_TRUE(torch::equal(w.grad(), torch::zeros({24, 40}))) << name(recipe);
  }
}

// Projections that read the same input keep one FP8 copy of it between them, with the numbers of
// a copy each; the copy goes with the last backward pass that keeps it, and an input changed in
// place is quantized again.
TEST(Fp8InputShare, ProjectionsOfOneInputKeepOneCopy) {
  torch::manual_seed(9);
  const torch::Tensor x0 = torch::randn({2, 5, 64}), dy = torch::randn({2, 5, 32});
  const torch::Tensor wq = torch::randn({32, 64}) * 0.1, wk = torch::randn({32, 64}) * 0.1;
  for (Fp8Recipe recipe : kRecipes) {
    auto run = [&](Fp8InputShare* share) {
      const torch::Tensor x = x0.clone().requires_grad_(true);
      const torch::Tensor a = wq.clone().requires_grad_(true), b = wk.clone().requires_grad_(true);
      Fp8WeightCache ca, cb;
      const torch::Tensor y = fp8_projection(x, a, {recipe, &ca, nullptr, share}) +
                              fp8_projection(x, b, {recipe, &cb, nullptr, share});
      y.backward(dy);
      return std::vector<torch::Tensor>{y, x.grad(), a.grad(), b.grad()};
    };
    Fp8InputShare share;
    const std::vector<torch::Tensor> shared = run(&share), apart = run(nullptr);
    EXPECT_EQ(share.made(), 1) << name(recipe);
    for (size_t i = 0; i < shared.size(); ++i) EXPECT_TRUE(torch::equal(shared[i], apart[i])) << name(recipe) << " " << i;
  }
  Fp8InputShare share;
  torch::Tensor x = x0.view({-1, 64}).clone();
  const Fp8Tensor first = share.quantized(x, -1, x, {1, 128});
  EXPECT_TRUE(share.quantized(x, -1, x, {1, 128}).codes.is_same(first.codes));  // kept alive by `first`
  x.mul_(2);
  EXPECT_FALSE(share.quantized(x, -1, x, {1, 128}).codes.is_same(first.codes));
  EXPECT_EQ(share.made(), 2);
}

// The products take both operands tiled along K: a quantization across K (the weight in the input
// gradient, dy and x in the weight gradient) enters transposed, as the quantization of the
// transposed tensor in the transposed tiles.
TEST(Fp8Quantization, ATransposedQuantizationIsThatOfTheTransposedTensor) {
  torch::manual_seed(13);
  const torch::Tensor x = torch::randn({200, 300}) * torch::rand({200, 1}) * 10;
  for (Fp8Tile tile : std::vector<Fp8Tile>{{0, 0}, {1, 0}, {0, 1}, {1, 128}, {128, 1}, {128, 128}}) {
    const std::string what = std::to_string(tile.rows) + "x" + std::to_string(tile.cols);
    const Fp8Tensor transposed = fp8_transposed(fp8_quantize(x, tile));
    const Fp8Tensor of_transpose = fp8_quantize(x.t(), {tile.cols, tile.rows});
    EXPECT_EQ(transposed.tile, of_transpose.tile) << what;
    EXPECT_TRUE(torch::equal(compat::from_e4m3(transposed.codes), compat::from_e4m3(of_transpose.codes))) << what;
    EXPECT_TRUE(torch::equal(transposed.scales, of_transpose.scales)) << what;
    expect_same_values(fp8_dequantize(transposed), reference_values(x.t(), {tile.cols, tile.rows}), what);
  }
}

// Where LibTorch's FP8 kernel cannot run (the CPU; LibTorch before 2.10) it says why and returns
// nothing, without refusing for later calls; the products given it are then the emulation's.
TEST(Fp8Matmul, WhereItCannotRunItSaysWhyAndTheProductsAreEmulated) {
  torch::manual_seed(14);
  const Fp8Tensor a = fp8_quantize(torch::randn({48, 256}), {1, 128});
  const Fp8Tensor b = fp8_quantize(torch::randn({32, 256}), {128, 128});
  const std::string why = fp8_matmul_refusal(a, b);
  EXPECT_NE(why.find(fp8_matmul_built() ? "not on a GPU" : "2.10"), std::string::npos) << why;
  Fp8Matmul kernel;
  EXPECT_FALSE(kernel(a, b).defined());
  EXPECT_FALSE(kernel.refused());
  const torch::Tensor product = fp8_product(a, b, &kernel);
  EXPECT_EQ(product.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(product, fp8_product(a, b, nullptr)));
  EXPECT_TRUE(torch::allclose(product, fp8_dequantize(a).mm(fp8_dequantize(b).t())));
}
