// E4M3 codes to values by a table of all 256, and values to codes by a search of its sorted
// positive half (fp8_e4m3.h).
#include "dstrain/core/fp8_e4m3.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

constexpr uint8_t kSign = 0x80;
constexpr uint8_t kMaxCode = 0x7E;  // 448: S.1111.110

// The value of a code from its fields, as the format defines it.
float value_of(uint8_t code) {
  const int exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return (code & kSign) ? -magnitude : magnitude;
}

const std::array<float, 256>& table() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> v{};
    for (int code = 0; code < 256; ++code) v[static_cast<size_t>(code)] = value_of(static_cast<uint8_t>(code));
    return v;
  }();
  return values;
}

}  // namespace

float e4m3_value(uint8_t code) { return table()[code]; }

bool e4m3_is_nan(uint8_t code) { return (code & 0x7F) == 0x7F; }

uint8_t e4m3_code(float value) {
  if (std::isnan(value)) return std::signbit(value) ? 0xFF : 0x7F;
  const uint8_t sign = std::signbit(value) ? kSign : 0;
  const float magnitude = std::fabs(value);
  if (magnitude >= kE4M3Max) return sign | kMaxCode;
  // Codes 0 to 0x7E are the non-negative finite values in increasing order: `above` is the
  // first code greater than `magnitude`, `above - 1` the last not greater.
  const float* first = table().data();
  const uint8_t above = static_cast<uint8_t>(std::upper_bound(first, first + kMaxCode + 1, magnitude) - first);
  const uint8_t below = above - 1;
  // Neighbouring values have at most 4 significant bits each: their sum, like 2 × magnitude, is
  // exact in float32, so the comparison with the midpoint is too.
  const float twice = 2.0f * magnitude, midpoint_twice = table()[below] + table()[above];
  uint8_t code = twice < midpoint_twice ? below : twice > midpoint_twice ? above : (below % 2 == 0 ? below : above);
  return sign | code;
}

torch::Tensor e4m3_decode(const torch::Tensor& codes) {
  if (codes.scalar_type() != torch::kUInt8) throw Error(ExitCode::kInternal, "e4m3_decode: codes must be uint8");
  const torch::Tensor in = codes.contiguous();
  torch::Tensor out = torch::empty(in.sizes(), torch::kFloat32);
  const uint8_t* c = in.data_ptr<uint8_t>();
  float* v = out.data_ptr<float>();
  const std::array<float, 256>& values = table();
  for (int64_t i = 0, n = in.numel(); i < n; ++i) v[i] = values[c[i]];
  return out;
}

torch::Tensor e4m3_encode(const torch::Tensor& values) {
  const torch::Tensor in = values.to(torch::kFloat32).contiguous();
  torch::Tensor out = torch::empty(in.sizes(), torch::kUInt8);
  const float* v = in.data_ptr<float>();
  uint8_t* c = out.data_ptr<uint8_t>();
  for (int64_t i = 0, n = in.numel(); i < n; ++i) c[i] = e4m3_code(v[i]);
  return out;
}

}  // namespace dstrain
