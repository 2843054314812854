// FP8 training on GPUs. Quantization there gives the CPU's codes and scales.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/fp8_quantization.h"

using namespace dstrain;

namespace {

class GpuFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (accel::device_count() == 0) GTEST_SKIP() << "no GPU on this machine";
  }
};

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
