// 8-bit block quantization of gradients (optim/block_quantization.h) against an fp64 computation
// of what each format can represent: random blocks within the error bound, a block of zeros
// exact, one huge value beside small ones, and non-finite values coming back NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dstrain/optim/block_quantization.h"

using namespace dstrain;

namespace {

torch::Tensor round_trip(const torch::Tensor& values, BlockFormat format) {
  return dequantize_blocks(quantize_blocks(values, format), format);
}

// Per value: the largest error the format allows in its block (see block_quantization.h).
torch::Tensor bound(const torch::Tensor& values, BlockFormat format) {
  const torch::Tensor blocks = values.to(torch::kFloat64).view({-1, kQuantizationBlock});
  const torch::Tensor largest = blocks.abs().amax(1, true);
  const torch::Tensor allowed = format == BlockFormat::kInt8 ? (largest / 127 / 2).expand_as(blocks)
                                                             : blocks.abs() / 16 + largest / 448 * std::pow(2.0, -10);
  return (allowed * 1.0001 + 1e-30).reshape({-1});
}

}  // namespace

TEST(BlockQuantization, RandomBlocksAreWithinTheFormatsBound) {
  torch::manual_seed(1);
  // Blocks of very different magnitudes, as a model's gradients are.
  const torch::Tensor scales = torch::pow(10.0, torch::linspace(-8, 4, 16)).repeat_interleave(kQuantizationBlock);
  const torch::Tensor values = (torch::randn({16 * kQuantizationBlock}, torch::kFloat64) * scales).to(torch::kFloat32);
  for (BlockFormat format : {BlockFormat::kInt8, BlockFormat::kFp8E4M3}) {
    const torch::Tensor error = (round_trip(values, format).to(torch::kFloat64) - values.to(torch::kFloat64)).abs();
    EXPECT_TRUE((error <= bound(values, format)).all().item<bool>())
        << "worst excess " << (error - bound(values, format)).max().item<double>();
    // And the bound is not loose: a good share of it is used somewhere in each block.
    EXPECT_GT((error / bound(values, format)).max().item<double>(), 0.3);
  }
  const QuantizedBlocks blocks = quantize_blocks(values, BlockFormat::kInt8);
  EXPECT_EQ(blocks.codes.scalar_type(), torch::kUInt8);
  EXPECT_EQ(blocks.codes.numel(), values.numel());
  EXPECT_EQ(blocks.scales.numel(), 16);
}

TEST(BlockQuantization, ZerosAndAHugeValue) {
  torch::Tensor values = torch::zeros({2 * kQuantizationBlock});
  values[kQuantizationBlock] = 3e30f;         // the second block: one huge value ...
  values[kQuantizationBlock + 1] = 1.0f;      // ... beside small ones, which go to zero
  values[kQuantizationBlock + 2] = -2e28f;
  for (BlockFormat format : {BlockFormat::kInt8, BlockFormat::kFp8E4M3}) {
    const torch::Tensor back = round_trip(values, format);
    EXPECT_TRUE(torch::equal(back.narrow(0, 0, kQuantizationBlock), torch::zeros({kQuantizationBlock})));
    EXPECT_NEAR(back[kQuantizationBlock].item<double>() / 3e30, 1.0, 1e-6);  // the largest maps exactly
    EXPECT_EQ(back[kQuantizationBlock + 1].item<float>(), 0.0f);
    const double relative = format == BlockFormat::kInt8 ? 3e30 / 127 / 2 / 2e28 : 1.0 / 16;
    EXPECT_NEAR(back[kQuantizationBlock + 2].item<double>() / -2e28, 1.0, relative + 1e-6);
    EXPECT_TRUE(torch::isfinite(back).all().item<bool>());
  }
}

TEST(BlockQuantization, NonFiniteValuesMakeTheirBlockNaN) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    torch::Tensor values = torch::ones({3 * kQuantizationBlock});
    values[kQuantizationBlock + 5] = bad;
    for (BlockFormat format : {BlockFormat::kInt8, BlockFormat::kFp8E4M3}) {
      const torch::Tensor back = round_trip(values, format);
      EXPECT_TRUE(torch::isnan(back.narrow(0, kQuantizationBlock, kQuantizationBlock)).all().item<bool>()) << bad;
      EXPECT_TRUE(torch::equal(back.narrow(0, 0, kQuantizationBlock), torch::ones({kQuantizationBlock})));
      EXPECT_TRUE(torch::equal(back.narrow(0, 2 * kQuantizationBlock, kQuantizationBlock), torch::ones({kQuantizationBlock})));
    }
  }
}

// The host loop (int8 on the CPU) and the tensor operations (what GPUs run) give the same codes,
// scales and values.
TEST(BlockQuantization, TheHostLoopAndTheTensorOperationsAgree) {
  torch::manual_seed(2);
  torch::Tensor values = torch::randn({8 * kQuantizationBlock}) * torch::pow(10.0, torch::linspace(-6, 3, 8 * kQuantizationBlock));
  values.narrow(0, 0, kQuantizationBlock).zero_();
  values[3 * kQuantizationBlock + 7] = std::numeric_limits<float>::infinity();
  const QuantizedBlocks loop = quantize_blocks(values, BlockFormat::kInt8);
  const QuantizedBlocks ops = quantize_blocks_with_tensor_ops(values, BlockFormat::kInt8);
  EXPECT_TRUE(torch::equal(loop.codes, ops.codes));
  EXPECT_TRUE(torch::allclose(loop.scales, ops.scales, 0, 0, /*equal_nan=*/true));
  EXPECT_TRUE(torch::allclose(dequantize_blocks(loop, BlockFormat::kInt8),
                              dequantize_blocks_with_tensor_ops(ops, BlockFormat::kInt8), 0, 0, /*equal_nan=*/true));
}
