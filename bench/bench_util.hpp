#pragma once
// What every actorflow-bench metric uses: the median of its samples, its
// printed line, and the calls that end the bench with the reason of a failure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "bench/stats.hpp"
#include "caf/expected.hpp"
#include "core/tensor.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "actors/variable_directory.hpp"

namespace af::bench {

/// One variable op on a data channel; a failure ends the bench with its
/// reason. The value that came back.
inline af::tensor call(af::data_channel& ch, af::var_op op, const char* name,
                       const af::tensor* operand) {
  auto r = ch.call(op, name, operand, false);
  if (!r) {
    std::cerr << "actorflow-bench: " << af::describe(r.error()) << std::endl;
    std::exit(1);
  }
  return std::move(r->first);
}

/// MB/s of one memcpy of `src` into `dst` (same size, both allocated once
/// and pre-faulted by the caller): what one core of this machine moves in one
/// process, the ceiling of a shared-memory path.
inline double memcpy_mbps(std::vector<char>& dst, const std::vector<char>& src) {
  auto t0 = clock_type::now();
  std::memcpy(dst.data(), src.data(), src.size());
  auto secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  asm volatile("" : : "r"(dst.data()) : "memory"); // the copy is not optimized away
  return src.size() / 1e6 / secs;
}

/// The value of `x`, or the end of the bench with `what` and its error.
template <class T>
T ok(caf::expected<T> x, const char* what) {
  if (!x) {
    std::cerr << "actorflow-bench: " << what << ": " << af::describe(x.error()) << std::endl;
    std::exit(1);
  }
  return std::move(*x);
}

} // namespace af::bench
