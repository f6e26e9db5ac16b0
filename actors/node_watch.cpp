/// The step latency histograms' registry and the CAF variable-op counters
/// (actors/node_watch.hpp).
#include "actors/node_watch.hpp"

#include "actors/per_actor.hpp"

namespace af {

const std::array<double, latency_histogram::bucket_count>& latency_histogram::bounds() {
  static const std::array<double, bucket_count> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                     0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                     1,      2.5,     10,     30};
  return b;
}

void latency_histogram::observe(int64_t ns) noexcept {
  if (ns < 0)
    ns = 0;
  const auto& b = bounds();
  double s = static_cast<double>(ns) * 1e-9;
  size_t k = 0;
  while (k < bucket_count && s > b[k])
    ++k;
  counts_[k].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

latency_histogram::snapshot latency_histogram::read() const {
  snapshot out;
  for (size_t k = 0; k <= bucket_count; ++k) {
    out.counts[k] = counts_[k].load(std::memory_order_relaxed);
    out.count += out.counts[k];
  }
  out.sum_s = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return out;
}

namespace {

per_actor<latency_histogram>& histograms() {
  static per_actor<latency_histogram> table;
  return table;
}

} // namespace

std::shared_ptr<latency_histogram> step_latency_of(const caf::actor_addr& id, bool make) {
  return histograms().get(id, make);
}

void forget_step_latency(const caf::actor_addr& id) {
  histograms().forget(id);
}

caf_variable_counters& caf_variable_ops() {
  static caf_variable_counters c;
  return c;
}

} // namespace af
