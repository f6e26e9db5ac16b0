#pragma once
/// The bound and the outcome of a wait on a byte ring: the shared-memory rings
/// (net/shm_ring.hpp) and the UCX link (net/ucx_link.hpp) take and give the
/// same, so that the data plane treats both alike. Its own file so that the
/// UCX link needs nothing else of the shared-memory transport.

#include <atomic>
#include <chrono>

namespace af {

/// How long a read or write may wait, and for what.
struct ring_bound {
  /// No progress by then: timeout (max(): none).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  /// No byte moved for this long: timeout (0: none). `first_ms` for the
  /// first byte of a read instead (0: stall_ms).
  int stall_ms = 0;
  int first_ms = 0;
  /// Looked at every 20 ms while waiting; set: cancelled.
  const std::atomic<bool>* cancel = nullptr;
  /// Look this long for bytes or room (yielding the CPU between looks)
  /// before sleeping; at least one look after one yield. The shared-memory
  /// rings skip it while it keeps failing (net/shm_ring.cpp).
  std::chrono::microseconds spin{20};
  /// Shared memory: a wait sleeps on a futex in the segment for up to
  /// `futex_ms` (then in poll on the socket's doorbell, so that an idle
  /// connection costs nothing), looking at the socket (a peer gone) and the
  /// cancel flag every `check_ms` meanwhile (in poll, at the ring every
  /// max(check_ms, 1 s)). A check_ms under 1 counts as 1.
  int futex_ms = 100;
  int check_ms = 2;
};

/// How a read or write on a ring ended.
enum class ring_status {
  done,
  closed,    ///< the peer closed its socket (or died) first
  idle,      ///< a read's first byte did not come within first_ms
  timeout,   ///< the deadline passed, or no progress within stall_ms
  cancelled, ///< ring_bound::cancel was set
  corrupt,   ///< the peer broke the ring's counters
};

} // namespace af
