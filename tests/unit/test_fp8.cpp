// FP8 weights: the E4M3 format against an encoder and a formula of the test's own, in fp64, and
// DeepSeek's block scales (partial edge blocks, damaged scales, quantization error).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "dstrain/ckpt/fp8_blocks.h"
#include "dstrain/core/fp8_e4m3.h"
#include "e4m3_reference.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;
using dstrain::test::formula;
using dstrain::test::kNaN;
using dstrain::test::reference_code;

namespace {

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }

}  // namespace

// Every code decodes to its formula's value, and both encoders give the code back.
TEST(Fp8E4M3, AllCodesRoundTripThroughAnIndependentEncoder) {
  torch::Tensor codes = torch::arange(256, torch::kInt32).to(torch::kUInt8);
  const torch::Tensor decoded = e4m3_decode(codes);
  ASSERT_EQ(decoded.scalar_type(), torch::kFloat32);
  int nans = 0;
  for (int code = 0; code < 256; ++code) {
    const double value = e4m3_value(static_cast<uint8_t>(code));
    EXPECT_TRUE(same(value, formula(code))) << code << ": " << value << " vs " << formula(code);
    EXPECT_TRUE(same(decoded[code].item<float>(), formula(code))) << code;
    if (std::isnan(value)) {
      ++nans;
      EXPECT_TRUE(e4m3_is_nan(static_cast<uint8_t>(code)));
      EXPECT_TRUE(e4m3_is_nan(e4m3_code(static_cast<float>(value))));
      continue;
    }
    EXPECT_EQ(reference_code(value), code) << value;
    EXPECT_EQ(e4m3_code(static_cast<float>(value)), code) << value;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_value(0x7E), 448.0f);
  EXPECT_EQ(e4m3_value(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_value(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(torch::equal(e4m3_encode(decoded.masked_fill(decoded.isnan(), 0)),
                           codes.masked_fill(decoded.isnan(), 0)));
}

// Between the codes, at the midpoints (ties to the even code) and a float's step either side of
// them, beyond 448 and at infinities, and over random values: the product encoder agrees with the
// test's own.
TEST(Fp8E4M3, EncoderRoundsToNearestEvenAndSaturates) {
  std::vector<float> values = {0.0f, -0.0f, 448.0f, 464.0f, 479.0f, 480.0f, 1e30f, -1e30f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::denorm_min(), std::ldexp(1.0f, -10), std::ldexp(1.0f, -11),
                               std::ldexp(3.0f, -11)};
  for (int code = 0; code < 0x7E; ++code) {
    const float midpoint = static_cast<float>((formula(code) + formula(code + 1)) / 2);
    for (float v : {midpoint, std::nextafter(midpoint, 0.0f), std::nextafter(midpoint, 1e9f)})
      values.insert(values.end(), {v, -v});
  }
  std::mt19937 generator(3);
  std::uniform_real_distribution<double> log2(-12, 10);
  for (int i = 0; i < 20000; ++i) {
    const float v = static_cast<float>(std::exp2(log2(generator)));
    values.push_back(i % 2 ? v : -v);
  }
  for (float v : values) EXPECT_EQ(e4m3_code(v), reference_code(v)) << v;
  EXPECT_EQ(e4m3_code(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(e4m3_code(-1e30f), 0xFE);
  EXPECT_EQ(e4m3_code(std::ldexp(1.0f, -10)), 0x00);  // a tie between 0 and 2^-9: to 0, the even code
  EXPECT_EQ(e4m3_code(std::ldexp(3.0f, -10)), 0x02);  // a tie between codes 1 and 2
  EXPECT_EQ(e4m3_code(1.0625f), 0x38);                // 1 + 1/16: between 1 (0x38) and 1.125 (0x39)
  EXPECT_EQ(e4m3_code(1.1875f), 0x3A);                // between 1.125 (0x39) and 1.25 (0x3A)
  EXPECT_TRUE(e4m3_is_nan(e4m3_code(std::numeric_limits<float>::quiet_NaN())));
  const torch::Tensor tensor = torch::tensor(values);
  const torch::Tensor encoded = e4m3_encode(tensor);
  for (size_t i = 0; i < values.size(); i += 97) EXPECT_EQ(encoded[static_cast<int64_t>(i)].item<uint8_t>(), e4m3_code(values[i]));
}

TEST(Fp8Blocks, ScaleShapesRoundUp) {
  EXPECT_EQ(fp8_scale_shape({7168, 2048}, {}), (std::vector<int64_t>{56, 16}));
  EXPECT_EQ(fp8_scale_shape({576, 7168}, {}), (std::vector<int64_t>{5, 56}));  // V3's kv_a_proj_with_mqa
  EXPECT_EQ(fp8_scale_shape({129, 128}, {}), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(fp8_scale_shape({37, 21}, {16, 8}), (std::vector<int64_t>{3, 3}));
}

// Each code's value times its block's scale, partial blocks at the bottom and right included,
// is what fp64 computes, rounded once to float32.
TEST(Fp8Blocks, DequantizesPartialEdgeBlocksAsFp64Does) {
  const Fp8BlockSize block{16, 8};
  const int64_t rows = 37, cols = 21;
  torch::Tensor codes = torch::randint(0, 256, {rows, cols}, torch::TensorOptions().dtype(torch::kUInt8));
  codes = torch::where(codes.bitwise_and(0x7F) == 0x7F, torch::zeros_like(codes), codes);
  torch::Tensor scales = torch::empty({3, 3}, torch::kFloat32);
  for (int64_t j = 0; j < 9; ++j) scales.view(-1)[j] = static_cast<float>(std::ldexp(1.0 + j / 7.0, static_cast<int>(j) - 4));
  const torch::Tensor weight = fp8_dequantize(codes, scales, block, "w");
  ASSERT_EQ(weight.sizes(), codes.sizes());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const double expected = formula(codes[r][c].item<uint8_t>()) * scales[r / 16][c / 8].item<float>();
      ASSERT_EQ(weight[r][c].item<float>(), static_cast<float>(expected)) << r << ", " << c;
    }
}

TEST(Fp8Blocks, DamagedScalesAndNaNCodesAreRefused) {
  const ExitCode code = ExitCode::kCheckpoint;
  const torch::Tensor codes = torch::full({20, 10}, 0x38, torch::kUInt8);
  const torch::Tensor good = torch::ones({2, 2});
  EXPECT_TRUE(torch::equal(fp8_dequantize(codes, good, {16, 8}, "w"), torch::ones({20, 10})));
  expect_error([&] { fp8_dequantize(codes, torch::ones({2, 1}), {16, 8}, "w"); }, code,
               {"tensor w", "scale_inv has shape [2, 1]", "[20, 10] in blocks of [16, 8] needs [2, 2]"});
  expect_error([&] { fp8_dequantize(codes, good, {16, 16}, "w"); }, code, {"tensor w", "needs [2, 1]"});
  for (const auto& [value, text] : std::vector<std::pair<float, std::string>>{
           {std::numeric_limits<float>::quiet_NaN(), "is nan"},
           {std::numeric_limits<float>::infinity(), "is infinite"},
           {0.0f, "is 0"},
           {-2.0f, "is -2"}}) {
    torch::Tensor bad = good.clone();
    bad[1][0] = value;
    EXPECT_EQ(fp8_scale_problem(bad).rfind("element [1, 0] " + text, 0), 0u) << fp8_scale_problem(bad);
    expect_error([&] { fp8_dequantize(codes, bad, {16, 8}, "w"); }, code, {"tensor w", "element [1, 0]", text});
  }
  torch::Tensor nan_code = codes.clone();
  nan_code[3][4] = 0xFF;
  expect_error([&] { fp8_dequantize(nan_code, good, {16, 8}, "w"); }, code, {"tensor w", "element [3, 4]", "NaN"});
  expect_error([&] { fp8_dequantize(torch::zeros({4}, torch::kUInt8), torch::ones({1}), {16, 8}, "v"); }, code,
               {"tensor v", "2-D"});
}

// DeepSeek's quantization: scale_inv = block max / 448 (1 for zeros), codes rounded to nearest,
// the largest magnitude of each block at ±448; dequantized within 2^-4 of the block's max.
TEST(Fp8Blocks, QuantizationIsDeepSeeksAndRoundTripsWithinRounding) {
  torch::manual_seed(11);
  const Fp8BlockSize block{128, 128};
  const int64_t rows = 300, cols = 200;  // blocks of 128, 128, 44 rows × 128, 72 columns
  torch::Tensor weight = torch::randn({rows, cols}, torch::kFloat64);
  weight.slice(0, 0, 128).slice(1, 0, 128).mul_(1e-4);  // blocks of very different magnitudes
  weight.slice(0, 256, 300).slice(1, 128, 200).mul_(1e3);
  weight.slice(0, 128, 256).slice(1, 128, 200).zero_();
  weight[5][7] = 1e-30;  // far below the block's smallest step: rounds to 0
  const torch::Tensor w32 = weight.to(torch::kFloat32);
  const Fp8Weight q = fp8_quantize(w32, block, "w");
  ASSERT_EQ(q.codes.scalar_type(), torch::kUInt8);
  ASSERT_EQ(q.scale_inv.sizes(), (torch::IntArrayRef{3, 2}));
  const torch::Tensor back = fp8_dequantize(q.codes, q.scale_inv, block, "w").to(torch::kFloat64);
  for (int64_t br = 0; br < 3; ++br)
    for (int64_t bc = 0; bc < 2; ++bc) {
      const torch::Tensor original = w32.slice(0, br * 128, std::min<int64_t>(rows, br * 128 + 128))
                                         .slice(1, bc * 128, std::min<int64_t>(cols, bc * 128 + 128));
      const torch::Tensor restored = back.slice(0, br * 128, std::min<int64_t>(rows, br * 128 + 128))
                                         .slice(1, bc * 128, std::min<int64_t>(cols, bc * 128 + 128));
      const float largest = original.abs().max().item<float>();
      const float scale = q.scale_inv[br][bc].item<float>();
      if (largest == 0) {
        EXPECT_EQ(scale, 1.0f);
        EXPECT_EQ(restored.abs().max().item<double>(), 0.0);
        continue;
      }
      EXPECT_EQ(scale, largest / 448.0f) << br << ", " << bc;
      const double error = (restored - original.to(torch::kFloat64)).abs().max().item<double>();
      EXPECT_LE(error, largest / 16.0) << br << ", " << bc;
      EXPECT_GT(error, 0.0);  // it is rounding
      EXPECT_EQ(restored.abs().max().item<double>(), 448.0f * scale);  // the max maps to ±448
    }
  EXPECT_EQ(q.codes[5][7].item<uint8_t>() & 0x7F, 0);
  EXPECT_FALSE(q.codes.bitwise_and(0x7F).eq(0x7F).any().item<bool>());
  torch::Tensor infinite = w32.clone();
  infinite[299][199] = std::numeric_limits<float>::infinity();
  expect_error([&] { fp8_quantize(infinite, block, "w"); }, ExitCode::kCheckpoint, {"tensor w", "[299, 199]", "finite"});
}
