#pragma once
/// The cores this process may run on: its affinity mask (taskset, a
/// container's cpuset), else the machine's; at least 1. What a split of work
/// (core/parallel_ranges) and a benchmark's CPU ceiling count.
#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <thread>

namespace af {

inline size_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<size_t>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

} // namespace af
