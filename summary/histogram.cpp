#include "summary/histogram.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace af::summary {

const std::vector<double>& default_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1)
      pos.push_back(v);
    pos.push_back(DBL_MAX);
    std::vector<double> all;
    all.reserve(2 * pos.size() + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it)
      all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return limits;
}

histogram make_histogram(const float* values, size_t n) {
  const auto& limits = default_limits();
  std::vector<double> counts(limits.size(), 0.0);
  histogram h;
  h.min = DBL_MAX;
  h.max = -DBL_MAX;
  for (size_t i = 0; i < n; ++i) {
    double v = values[i];
    if (!std::isfinite(v))
      continue;
    // The first limit above v (TensorFlow's Histogram::Add): a bucket holds
    // [previous limit, limit).
    auto at = std::upper_bound(limits.begin(), limits.end(), v) - limits.begin();
    counts[std::min<size_t>(static_cast<size_t>(at), limits.size() - 1)] += 1;
    h.min = std::min(h.min, v);
    h.max = std::max(h.max, v);
    h.num += 1;
    h.sum += v;
    h.sum_squares += v * v;
  }
  if (h.num == 0)
    h.min = h.max = 0;
  // Runs of empty buckets become one (its limit the run's last), as
  // TensorFlow's Histogram::EncodeToProto without preserve_zero_buckets.
  for (size_t i = 0; i < counts.size();) {
    double end = limits[i];
    double count = counts[i];
    ++i;
    if (count <= 0.0)
      while (i < counts.size() && counts[i] <= 0.0)
        end = limits[i++];
    h.limits.push_back(end);
    h.counts.push_back(count);
  }
  return h;
}

} // namespace af::summary
