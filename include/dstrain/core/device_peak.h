// The peak a device's throughput is judged by (MFU = achieved FLOP/s ÷ peak): the vendor's data-sheet
// dense figure for the exact product CUDA names, or the one the user configures.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace dstrain {

// Dense TFLOP/s of one device of the product CUDA calls `device_name` ("NVIDIA H100 NVL") for
// `precision`: bf16 and fp16 on tensor cores with fp32 accumulation, fp32 without tensor cores.
// Matched on the whole name, never a part of it (an H100 NVL is not an H100 SXM); 0 when unknown.
double data_sheet_peak_tflops(const std::string& device_name, c10::ScalarType precision);

struct DevicePeak {
  double tflops = 0;       // of one device; 0: unknown, no MFU
  std::string described;   // where the figure comes from, for the start-up report
};
// `configured` (train.peak_tflops) when above 0, else the data sheet's figure.
DevicePeak device_peak(const std::string& device_name, c10::ScalarType precision, double configured);

}  // namespace dstrain
