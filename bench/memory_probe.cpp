// memcpy_4mib_working_set (issue 24, docs/performance.md "Memory traffic,
// not overlap"): what a 4 MiB copy costs once the bytes a step touches no
// longer fit in the CPU's last-level cache. The 1 M sync job's three
// processes touch about 40 MB of buffers a step (each worker's x, answer
// and gradient, the ps's pushes and values), and its socket buffers
// besides: on a CPU whose cache is smaller, its copies and kernels run at
// memory speed, which on 2 vCPUs weighs more than any overlap.
//
// The line: GB/s of 4 MiB memcpys that walk a 128 MiB working set (each
// copy's source and destination the next buffers of 32) against the same
// copies between two buffers (8 MiB, in cache where the last-level cache
// is larger and memcpy does not switch to non-temporal stores), alternating
// `reps` times (at least 5), medians, on 2 MiB pages as the runtime's
// tensors of 2 MiB or more are. A `#` line gives the sweep from 8 to
// 128 MiB, the 128 MiB walk on 4 KiB pages, and the level 3 cache's size.
#include "bench/benches.hpp"
#include "bench/stats.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace af::bench {

namespace {

constexpr size_t copy_bytes = size_t{4} << 20;

struct free_deleter {
  void operator()(char* p) const { std::free(p); }
};
using buffer = std::unique_ptr<char, free_deleter>;

/// `count` buffers of copy_bytes, touched: on 2 MiB pages where the kernel
/// gives them if `huge`, as the runtime's tensors of this size are
/// (core/tensor.cpp), else on whatever malloc's memory is (4 KiB pages
/// where transparent huge pages are "madvise").
std::vector<buffer> buffers(size_t count, bool huge) {
  std::vector<buffer> out;
  for (size_t i = 0; i < count; ++i) {
    auto* p = static_cast<char*>(std::aligned_alloc(huge ? size_t{2} << 20 : 64, copy_bytes));
    if (p == nullptr)
      return {};
    if (huge)
      madvise(p, copy_bytes, MADV_HUGEPAGE); // a hint: failure is fine
    std::memset(p, static_cast<int>(i + 1), copy_bytes);
    out.emplace_back(p);
  }
  return out;
}

/// GB/s of `copies` copies walking the first `count` buffers of `bufs`:
/// copy k reads buffer 2k and writes buffer 2k + 1 (mod count).
double copy_rate(std::vector<buffer>& bufs, size_t count, int copies) {
  auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < copies; ++k) {
    char* src = bufs[(2 * static_cast<size_t>(k)) % count].get();
    char* dst = bufs[(2 * static_cast<size_t>(k) + 1) % count].get();
    std::memcpy(dst, src, copy_bytes);
    asm volatile("" : : "r"(dst) : "memory"); // the copy is not dropped
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(copies) * copy_bytes / 1e9 / s;
}

/// The level 3 cache's size as the kernel gives it to lscpu (sysconf's
/// figure is the host's in some VMs): "32768K", or "unknown".
std::string l3_cache() {
  std::ifstream in{"/sys/devices/system/cpu/cpu0/cache/index3/size"};
  std::string size;
  return in >> size ? size : "unknown";
}

} // namespace

int memory_probe_bench(const wanted_fn& wanted, int reps) {
  if (!wanted("memcpy_4mib_working_set"))
    return 0;
  constexpr size_t most = 32; // 128 MiB
  constexpr int copies = 256; // 1 GiB a measurement
  double small_pages = 0;     // the 128 MiB walk on 4 KiB pages, once
  {
    auto bufs = buffers(most, false);
    if (!bufs.empty()) {
      copy_rate(bufs, most, copies / 4);
      small_pages = copy_rate(bufs, most, copies);
    }
  }
  auto bufs = buffers(most, true);
  if (bufs.empty()) {
    std::printf("metric memcpy_4mib_working_set skipped: no memory for %zu MiB of buffers\n",
                most * (copy_bytes >> 20));
    return 0;
  }
  for (size_t count : {size_t{2}, most}) // warm-up: pages and frequency
    copy_rate(bufs, count, copies / 4);
  std::vector<double> large, small;
  for (int r = 0; r < std::max(reps, 5); ++r) {
    large.push_back(copy_rate(bufs, most, copies));
    small.push_back(copy_rate(bufs, 2, copies));
  }
  std::string sweep; // one measurement a size
  for (size_t count : {size_t{2}, size_t{4}, size_t{8}, size_t{16}, most})
    sweep += " " + std::to_string(count * (copy_bytes >> 20)) + " MiB "
             + std::to_string(static_cast<int>(copy_rate(bufs, count, copies) + 0.5)) + ";";
  std::printf("# memcpy_4mib_working_set: 4 MiB memcpys walking a 128 MiB working set (ours) "
              "against the same copies between two buffers (8 MiB, the baseline), on 2 MiB "
              "pages; GB/s by working set, one run each:%s on 4 KiB pages 128 MiB %.0f; level 3 "
              "cache: %s\n",
              sweep.c_str(), small_pages, l3_cache().c_str());
  report("memcpy_4mib_working_set", median(large), median(small), "GB/s");
  return 0;
}

} // namespace af::bench
