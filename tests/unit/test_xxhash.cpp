#include <gtest/gtest.h>

#include <vector>

#include "dstrain/core/xxhash.h"

using dstrain::xxh64;

// Against the reference implementation (xxhsum -H1 of xxHash 0.8.1) on inputs that exercise
// every path: empty, the 1/4/8-byte tails, exactly one 32-byte stripe, many stripes.
TEST(XXH64, MatchesTheReferenceImplementation) {
  EXPECT_EQ(xxh64("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(xxh64("a", 1), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(xxh64("abc", 3), 0x44bc2cf5ad770999ull);
  const std::pair<size_t, uint64_t> cases[] = {{31, 0x4a74f3a1a39ad4a1ull},  {32, 0x8d57d6a4671cc43dull},
                                               {33, 0x62c9fd21ed857664ull},  {100, 0xefa0ad2d3e70c151ull},
                                               {1000, 0x99594f4828043d35ull}, {4099, 0x98531e44aa4f969dull}};
  for (const auto& [size, expected] : cases) {
    std::vector<unsigned char> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<unsigned char>((i * 31 + 7) % 256);
    EXPECT_EQ(xxh64(bytes.data(), size), expected) << size << " bytes";
    bytes[size / 2] ^= 1;  // one flipped bit changes it
    EXPECT_NE(xxh64(bytes.data(), size), expected);
  }
  EXPECT_EQ(dstrain::hex64(0x44bc2cf5ad770999ull), "44bc2cf5ad770999");
}
