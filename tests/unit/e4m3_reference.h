// The tests' own E4M3 (core/fp8_e4m3.h), in fp64 from the format's definition: independent of
// the encoder under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace dstrain::test {

inline const double kNaN = std::numeric_limits<double>::quiet_NaN();

// E4M3 by its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 NaN.
inline double formula(int code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return kNaN;
  const double magnitude = exponent == 0 ? mantissa * std::pow(2.0, -9)
                                         : (1.0 + mantissa / 8.0) * std::pow(2.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// The test's own encoder, from fp64: the exponent by frexp, the mantissa rounded to 3 bits by
// nearbyint (ties to even in the default rounding mode), saturation at 448.
inline uint8_t reference_code(double x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xFF : 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7E;
  if (a < std::pow(2.0, -6)) {  // subnormal: multiples of 2^-9; 8 × 2^-9 is the first normal, code 8
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0));
  }
  int k = 0;
  const double fraction = std::frexp(a, &k);  // a = fraction × 2^k, fraction in [0.5, 1)
  int exponent = k - 1;
  int mantissa = static_cast<int>(std::nearbyint((2.0 * fraction - 1.0) * 8.0));
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | mantissa);
}

}  // namespace dstrain::test
