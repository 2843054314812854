#include "dstrain/core/random.h"

namespace dstrain {

uint64_t mix_seed(uint64_t a, uint64_t b) {
  SplitMix64 first(a);
  SplitMix64 second(first.next() ^ b);
  return second.next();
}

uint64_t hash_string(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

}  // namespace dstrain
