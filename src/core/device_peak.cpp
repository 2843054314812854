#include "dstrain/core/device_peak.h"

#include <cstdio>

namespace dstrain {
namespace {

struct ProductPeak {
  const char* name;  // as CUDA reports it, without the "NVIDIA " that drivers put in front
  double half;       // dense bf16/fp16 tensor-core TFLOP/s, fp32 accumulation
  double fp32;       // fp32 TFLOP/s without tensor cores
};

// From NVIDIA's data sheets (sparse figures halved). CUDA's names carry the memory size where two
// variants of a product share a name otherwise (A100 40GB and 80GB have the same figures); the
// SXM, PCIe and NVL boards of one chip differ in clock and power, and so in peak.
constexpr ProductPeak kProductPeaks[] = {
    // Ampere
    {"A100-SXM4-40GB", 312, 19.5},
    {"A100-SXM4-80GB", 312, 19.5},
    {"A100-PCIE-40GB", 312, 19.5},
    {"A100 80GB PCIe", 312, 19.5},
    {"A800-SXM4-40GB", 312, 19.5},
    {"A800-SXM4-80GB", 312, 19.5},
    {"A800 40GB PCIe", 312, 19.5},
    {"A800 80GB PCIe", 312, 19.5},
    {"A40", 149.7, 37.4},
    {"A30", 165, 10.3},
    {"A10", 125, 31.2},
    {"GeForce RTX 3090", 71, 35.6},
    // Ada
    {"L40S", 362.05, 91.6},
    {"L40", 181.05, 90.5},
    {"L4", 121, 30.3},
    {"GeForce RTX 4090", 165.2, 82.6},
    // Hopper
    {"H100 80GB HBM3", 989.5, 66.9},  // SXM
    {"H100 PCIe", 756.5, 51.2},
    {"H100 NVL", 835.5, 60},
    {"H800", 989.5, 66.9},  // SXM
    {"H800 PCIe", 756.5, 51.2},
    {"H20", 148, 44},
    {"H200", 989.5, 66.9},  // SXM
    {"H200 NVL", 835.5, 60},
    {"GH200 480GB", 989.5, 66.9},
    {"GH200 144G HBM3e", 989.5, 66.9},
    // Blackwell
    {"B200", 2250, 75},
};

std::string product_of(const std::string& device_name) {
  const std::string vendor = "NVIDIA ";
  return device_name.rfind(vendor, 0) == 0 ? device_name.substr(vendor.size()) : device_name;
}

std::string tflops_text(double tflops) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", tflops);
  return text;
}

}  // namespace

double data_sheet_peak_tflops(const std::string& device_name, c10::ScalarType precision) {
  const std::string product = product_of(device_name);
  for (const ProductPeak& p : kProductPeaks)
    if (product == p.name) return precision == c10::ScalarType::Float ? p.fp32 : p.half;
  return 0;
}

DevicePeak device_peak(const std::string& device_name, c10::ScalarType precision, double configured) {
  if (configured > 0) return {configured, tflops_text(configured) + " TFLOP/s per device (train.peak_tflops)"};
  const double known = data_sheet_peak_tflops(device_name, precision);
  const char* kind = precision == c10::ScalarType::Float ? "fp32" : "bf16/fp16 tensor-core";
  if (known > 0)
    return {known, tflops_text(known) + " TFLOP/s per device, the data sheet's dense " + kind + " figure for the " +
                       device_name};
  return {0, "none: no data-sheet peak is known for " + device_name + "; train.peak_tflops sets one"};
}

}  // namespace dstrain
