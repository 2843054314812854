// Portable, specified random numbers: the same seed gives the same stream on every platform and
// standard library (std::uniform_int_distribution and std::shuffle do not promise that).
#pragma once

#include <cstdint>
#include <string>

namespace dstrain {

// SplitMix64 (Steele, Lea, Flood 2014): a tiny generator with good statistical quality.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) without modulo bias (Lemire 2019, with rejection).
  uint64_t below(uint64_t bound) {
    unsigned __int128 product = static_cast<unsigned __int128>(next()) * bound;
    uint64_t low = static_cast<uint64_t>(product);
    if (low < bound) {
      uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        product = static_cast<unsigned __int128>(next()) * bound;
        low = static_cast<uint64_t>(product);
      }
    }
    return static_cast<uint64_t>(product >> 64);
  }

 private:
  uint64_t state_;
};

// Mixes several values into one seed, e.g. (run seed, epoch) or (run seed, parameter name).
uint64_t mix_seed(uint64_t a, uint64_t b);
uint64_t hash_string(const std::string& text);  // FNV-1a, 64 bit

}  // namespace dstrain
