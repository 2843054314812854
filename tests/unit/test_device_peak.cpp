// MFU's peak per device: the data sheet's dense figure for the exact product CUDA names, each
// written here as the data sheet gives it (a figure with sparsity halved).
#include <gtest/gtest.h>

#include "dstrain/core/device_peak.h"

using dstrain::data_sheet_peak_tflops;
using dstrain::device_peak;

namespace {
constexpr auto kBf16 = c10::ScalarType::BFloat16;
constexpr auto kFp32 = c10::ScalarType::Float;
}  // namespace

TEST(DevicePeak, EachProductHasItsOwnDataSheetFigure) {
  struct Product {
    const char* cuda_name;
    double bf16, fp32;
  };
  const Product products[] = {
      {"NVIDIA A100-SXM4-80GB", 624 / 2.0, 19.5},
      {"NVIDIA A100 80GB PCIe", 624 / 2.0, 19.5},  // the 8× A100 machines dstrain was specified for
      {"A100-SXM4-40GB", 624 / 2.0, 19.5},         // older drivers leave out "NVIDIA "
      {"NVIDIA A800-SXM4-80GB", 624 / 2.0, 19.5},
      {"NVIDIA H100 80GB HBM3", 1979 / 2.0, 66.9},  // SXM
      {"NVIDIA H100 PCIe", 1513 / 2.0, 51.2},
      {"NVIDIA H100 NVL", 1671 / 2.0, 60},  // once given the SXM's figure
      {"NVIDIA H800", 1979 / 2.0, 66.9},
      {"NVIDIA H20", 148, 44},
      {"NVIDIA H200", 1979 / 2.0, 66.9},
      {"NVIDIA H200 NVL", 1671 / 2.0, 60},
      {"NVIDIA L40S", 362.05, 91.6},  // the data sheet gives the dense figure too
      {"NVIDIA L40", 181.05, 90.5},
      {"NVIDIA B200", 4500 / 2.0, 75},
      {"NVIDIA GeForce RTX 4090", 330.4 / 2.0, 82.6},  // fp32 accumulation: half the fp16-accumulate rate
  };
  for (const Product& p : products) {
    EXPECT_NEAR(data_sheet_peak_tflops(p.cuda_name, kBf16), p.bf16, 0.01) << p.cuda_name;
    EXPECT_NEAR(data_sheet_peak_tflops(p.cuda_name, c10::ScalarType::Half), p.bf16, 0.01) << p.cuda_name;
    EXPECT_NEAR(data_sheet_peak_tflops(p.cuda_name, kFp32), p.fp32, 0.01) << p.cuda_name;
  }
}

// The whole name decides: a product whose name contains a known one is not that one.
TEST(DevicePeak, ANameIsMatchedWholeNeverByAPart) {
  for (const char* unknown : {"NVIDIA GeForce RTX 4090 D", "NVIDIA H100", "NVIDIA A100", "NVIDIA L40G", "cpu", ""})
    EXPECT_EQ(data_sheet_peak_tflops(unknown, kBf16), 0) << unknown;
  EXPECT_NE(data_sheet_peak_tflops("NVIDIA H100 NVL", kBf16), data_sheet_peak_tflops("NVIDIA H100 80GB HBM3", kBf16));
  EXPECT_NE(data_sheet_peak_tflops("NVIDIA L40", kBf16), data_sheet_peak_tflops("NVIDIA L40S", kBf16));
}

TEST(DevicePeak, TheStartUpLineSaysWhichPeakMfuUses) {
  const dstrain::DevicePeak configured = device_peak("NVIDIA H100 NVL", kBf16, 500);
  EXPECT_EQ(configured.tflops, 500);
  EXPECT_EQ(configured.described, "500 TFLOP/s per device (train.peak_tflops)");

  const dstrain::DevicePeak known = device_peak("NVIDIA H100 NVL", kBf16, 0);
  EXPECT_EQ(known.tflops, 835.5);
  EXPECT_EQ(known.described,
            "835.5 TFLOP/s per device, the data sheet's dense bf16/fp16 tensor-core figure for the NVIDIA H100 NVL");

  const dstrain::DevicePeak unknown = device_peak("NVIDIA GeForce RTX 4090 D", kBf16, 0);
  EXPECT_EQ(unknown.tflops, 0);
  EXPECT_EQ(unknown.described,
            "none: no data-sheet peak is known for NVIDIA GeForce RTX 4090 D; train.peak_tflops sets one");
}
