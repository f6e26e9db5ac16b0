#pragma once
/// CRC-32C (Castagnoli), the checksum of TFRecord framing (event_file.hpp):
/// a table-driven byte-at-a-time one, enough for summaries (a few KiB a report).

#include <cstddef>
#include <cstdint>

namespace af::summary {

/// CRC-32C of `n` bytes at `data`, continuing `crc` (0 to start):
/// crc32c("123456789") is 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

/// The CRC as TFRecord stores it, rotated right by 15 and offset by
/// 0xa282ead8 (TensorFlow's crc32c::Mask), so that a CRC of data holding
/// CRCs stays a good check.
inline uint32_t mask_crc(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

} // namespace af::summary
