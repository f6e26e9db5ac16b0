#pragma once
/// Software prefetch of the rows of a big table (embedding shards: millions
/// of rows, a step touching a few hundred at random). Each such row is a
/// cache miss; a loop that copies or updates one row after the other waits
/// for each miss in turn. Asking for row i + rows_ahead while row i is
/// worked on overlaps the misses: on the 2-vCPU Xeon, 340 random rows of 64
/// floats out of 3.3 M went from about 65 to 40 us (gather) and 72 to 50 us
/// (an SGD update), and with the table on huge pages (core/tensor.cpp) to
/// 20 and 23 us. Prefetching is a hint: it never faults and changes no result.
#include <cstddef>

namespace af {

/// How many rows ahead a row loop asks for (2 to 8 measured alike).
inline constexpr size_t rows_ahead = 4;

/// Asks for the cache lines of the `bytes` at `p` (at most the first 512:
/// the hardware's own prefetcher follows a longer row); `for_write` when the
/// loop will write them.
inline void prefetch_row(const void* p, size_t bytes, bool for_write = false) {
  const auto* c = static_cast<const char*>(p);
  const size_t n = bytes < 512 ? bytes : 512;
  for (size_t o = 0; o < n; o += 64) {
    if (for_write)
      __builtin_prefetch(c + o, 1);
    else
      __builtin_prefetch(c + o, 0);
  }
}

} // namespace af
