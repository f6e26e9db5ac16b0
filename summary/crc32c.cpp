#include "summary/crc32c.hpp"

#include <array>

namespace af::summary {

namespace {

/// The table of the reflected polynomial 0x82F63B78 (CRC-32C's 0x1EDC6F41).
std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

} // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const auto table = make_table();
  auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i)
    crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

} // namespace af::summary
