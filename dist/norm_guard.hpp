#pragma once
/// The gradient-norm guard of an aggregator (aggregator_spec::grad_norm_guard),
/// with no CAF in it: the L2 norms of the recent gradients it took, and by
/// how much to scale a new one down so that its norm is at most `limit`
/// times their median. One push far outside the others (a worker's bug, a
/// bad batch, a hostile member) then moves the model no more than a large
/// ordinary one would. tests/test_aggregator.cpp drives it directly.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <vector>

namespace af {

class norm_guard {
public:
  /// Norms kept (the median is over these), and how many are needed
  /// before the guard acts (it knows no scale before).
  static constexpr size_t window = 32;
  static constexpr size_t warm_up = 8;

  norm_guard() = default;

  /// `limit`: a gradient may be at most this many times the median of the
  /// recent norms (0: off).
  explicit norm_guard(double limit) : limit_(limit) {
    // nop
  }

  bool enabled() const noexcept { return limit_ > 0; }

  double limit() const noexcept { return limit_; }

  /// The L2 norm of `parts` (part i: `sizes[i]` floats), in double.
  static double norm(const std::vector<const float*>& parts, const std::vector<size_t>& sizes) {
    double sum = 0;
    for (size_t i = 0; i < parts.size(); ++i)
      for (size_t k = 0; k < sizes[i]; ++k)
        sum += static_cast<double>(parts[i][k]) * static_cast<double>(parts[i][k]);
    return std::sqrt(sum);
  }

  /// The median of the recent norms (0 before the first).
  double median() const {
    if (recent_.empty())
      return 0;
    std::vector<double> v(recent_.begin(), recent_.end());
    auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    return *mid;
  }

  /// The factor (in (0, 1]) to scale a gradient of norm `n` by, and takes
  /// its norm after scaling into the window. 1 while off, warming up, or
  /// within the limit. The norm kept for a clipped gradient is the
  /// limit's, so the median follows a real growth of the gradients, by at
  /// most `limit` times per half window.
  double admit(double n) {
    if (!enabled())
      return 1;
    double factor = 1;
    if (recent_.size() >= warm_up) {
      double bound = limit_ * median();
      if (bound > 0 && n > bound)
        factor = bound / n;
    }
    recent_.push_back(n * factor);
    if (recent_.size() > window)
      recent_.pop_front();
    return factor;
  }

private:
  double limit_ = 0;
  std::deque<double> recent_;
};

} // namespace af
