#pragma once
/// A histogram of a variable's values as TensorBoard shows it (TensorFlow's
/// HistogramProto, summary/event.proto), over TensorFlow's default buckets:
/// limits ±1e-12 x 1.1^k up to 1e20, 0 and ±DBL_MAX, so that the same values
/// give the same picture as a TensorFlow job's tf.summary.histogram.

#include <cstddef>
#include <vector>

namespace af::summary {

struct histogram {
  double min = 0;
  double max = 0;
  double num = 0;
  double sum = 0;
  double sum_squares = 0;
  /// Parallel: counts[i] values in [limits[i-1], limits[i]) (the first from
  /// -DBL_MAX). Runs of empty buckets are one bucket up to the run's last
  /// limit, as TensorFlow writes them.
  std::vector<double> limits;
  std::vector<double> counts;
};

/// The histogram of `n` floats at `values`; NaNs and infinities are left out
/// (TensorBoard cannot draw them), so `num` counts the finite values.
histogram make_histogram(const float* values, size_t n);

/// TensorFlow's default bucket limits (increasing; the last is DBL_MAX).
const std::vector<double>& default_limits();

} // namespace af::summary
