#pragma once
// What the training metrics (bench_train.cpp) and their helper processes
// (train_helpers.cpp) agree on: the all-reduce's buffer and the 1 M workload
// (docs/training.md, "The 1 M workload"; config/linear_1m.toml).
#include <cstddef>
#include <cstdio>
#include <string>

#include "bench/stats.hpp"

namespace af::bench {

constexpr size_t model_floats = size_t{1} << 20; // the all-reduce's buffer; 4 MiB
constexpr size_t linear_features = 1000000;      // the 1 M workload's weights, and a bias
constexpr double linear_lr = 0.1;                // plain SGD; |x|^2 is about 1
constexpr uint64_t linear_seed = 1;              // the examples' (train::per_worker_linear)

/// A double as TOML and strtod read it back (std::to_string prints 1e-7 as 0.000000).
inline std::string exact(double x, int digits = 9) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, x);
  return buf;
}

} // namespace af::bench
