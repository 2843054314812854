// E4M3 codes to values by a table of all 256, and values to codes by rounding float32's bits
// (fp8_e4m3.h).
#include "dstrain/core/fp8_e4m3.h"

#include <array>
#include <cmath>
#include <cstring>
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
  // Subnormals (below 2^-6) are the multiples of 2^-9: magnitude × 512 is exact, and nearbyint
  // rounds it to nearest even in the default rounding mode (8 is 2^-6, the first normal's code).
  if (magnitude < 0.015625f) return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 512.0f));
  // Normals: float32's 23 mantissa bits rounded to E4M3's 3, ties to even, on the bits themselves
  // (a carry out of the mantissa moves the exponent up, as it should); then float32's exponent
  // bias (127) exchanged for E4M3's (7). Below 448 the result stays at most 448's code.
  uint32_t bits = 0;
  std::memcpy(&bits, &magnitude, sizeof bits);
  constexpr int kDropped = 23 - 3;
  bits += ((1u << (kDropped - 1)) - 1) + ((bits >> kDropped) & 1u);
  return sign | static_cast<uint8_t>((bits >> kDropped) - ((127u - 7u) << 3));
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
