#pragma once
// What the training metrics (bench_train.cpp) and their helper processes
// (train_helpers.cpp) agree on: the model's size and the baselines' rate.
#include <cstddef>
#include <cstdio>
#include <string>

#include "bench/stats.hpp"

namespace af::bench {

constexpr size_t model_floats = size_t{1} << 20; // the 1 M-float model; 4 MiB
constexpr size_t synthetic_examples = 16;        // per worker, ours and raw alike
constexpr double linear_lr = 1e-7;               // lr * |x|^2 < 1: no divergence

/// A double as TOML and strtod read it back (std::to_string prints 1e-7 as 0.000000).
inline std::string exact(double x, int digits = 9) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, x);
  return buf;
}

} // namespace af::bench
