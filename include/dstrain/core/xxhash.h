// XXH64 (Yann Collet's xxHash, 64-bit variant), written from its specification
// (github.com/Cyan4973/xxHash, doc/xxhash_spec.md): the checksum of every checkpoint dataset.
// Fast enough (several GB/s per core) to verify a checkpoint on every load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dstrain {

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);
std::string hex64(uint64_t value);  // 16 lower-case hex digits

}  // namespace dstrain
