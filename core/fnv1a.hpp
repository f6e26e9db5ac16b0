#pragma once
/// FNV-1a, 64 bits: a cheap checksum against accidents (a truncated file, a
/// buffer that is not what it claims), never against an attacker.

#include <cstddef>
#include <cstdint>

namespace af {

inline uint64_t fnv1a64(const char* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

} // namespace af
