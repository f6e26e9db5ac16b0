#pragma once
/// What a node counts about itself for whoever watches it (the metrics layer,
/// metrics/node_metrics.hpp, reads these at each scrape): the step latencies
/// of each executor and the variable ops that came as CAF messages. Writers
/// pay one relaxed atomic increment or a few; nothing here takes a lock on
/// their paths (the registry's mutex is taken when an executor starts or
/// ends, and by a scrape).

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "caf/actor_addr.hpp"

namespace af {

/// A histogram of durations with fixed buckets (Prometheus' cumulative
/// `le` buckets are summed from these at a scrape).
class latency_histogram {
public:
  static constexpr size_t bucket_count = 16;
  /// The buckets' upper bounds in seconds, 100 us to 30 s; one more bucket holds the rest.
  static const std::array<double, bucket_count>& bounds();

  /// Counts one duration of `ns` nanoseconds (relaxed increments).
  void observe(int64_t ns) noexcept;

  struct snapshot {
    std::array<uint64_t, bucket_count + 1> counts{}; ///< per bucket, not cumulative; last: above
    uint64_t count = 0;
    double sum_s = 0;
  };
  /// What it holds now (each figure read once; a scrape during a step may
  /// see its count before its sum).
  snapshot read() const;

private:
  std::array<std::atomic<uint64_t>, bucket_count + 1> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

/// The step latency histogram of executor `id` (made on the first call with
/// `make`; by address: a process may run several actor systems); the executor
/// keeps it, forget_step_latency drops it from the registry at its exit.
std::shared_ptr<latency_histogram> step_latency_of(const caf::actor_addr& id, bool make);
void forget_step_latency(const caf::actor_addr& id);

/// Variable ops that reached a variable actor as a CAF message (a session in
/// the node's own actor system, an executor's reads and updates, a peer over
/// CAF's port) in this process, and the bytes of their operands and values.
/// The data plane's ops are its own counters' (net/data_plane_counters.hpp).
/// A cache line of its own (as the data plane's per transport), not shared
/// with the process's other statics.
struct alignas(64) caf_variable_counters {
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> bytes_received{0}; ///< the operands' (and gather's ids')
  std::atomic<uint64_t> bytes_sent{0};     ///< the values answered
  void count(uint64_t received, uint64_t sent) noexcept {
    ops.fetch_add(1, std::memory_order_relaxed);
    bytes_received.fetch_add(received, std::memory_order_relaxed);
    bytes_sent.fetch_add(sent, std::memory_order_relaxed);
  }
};
caf_variable_counters& caf_variable_ops();

} // namespace af
