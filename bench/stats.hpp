#pragma once
// The figures of actorflow-bench: samples' median and the printed line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace af::bench {

using clock_type = std::chrono::steady_clock;

/// The median of `xs` (0 if there are none).
inline double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0 : xs[xs.size() / 2];
}

/// Prints `metric NAME ours=X baseline=Y unit=U ratio=Z`.
inline void report(const std::string& name, double ours, double baseline, const char* unit) {
  std::printf("metric %s ours=%.3f baseline=%.3f unit=%s ratio=%.3f\n", name.c_str(), ours, baseline,
              unit, ours / baseline);
  std::fflush(stdout);
}

} // namespace af::bench
