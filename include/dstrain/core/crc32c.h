// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78, initial and final value
// 0xFFFFFFFF): the checksum TFRecord files (TensorBoard event files) frame their records with.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dstrain {

uint32_t crc32c(const void* data, size_t size);

// TFRecord's "masked" CRC: rotated right by 15 bits plus a constant, so that a CRC computed over
// data that itself contains CRCs does not degenerate (TensorFlow's crc32c::Mask).
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace dstrain
