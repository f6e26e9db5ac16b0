#pragma once
/// A bounded spin before a sleep, for a thread that waits for a peer's
/// bytes: it looks again between sched_yield()s for a moment, and stops
/// spinning while its spins keep failing (trying one now and then). Used by
/// the shared-memory rings' waits (net/shm_ring.cpp) and a served TCP
/// connection's wait for its next frame (net/byte_channel.cpp). One thread
/// uses one.
///
/// Why yield and not pause: on a small or busy machine both ends often
/// share a CPU, and a pause loop then only delays the peer it waits for
/// (measured: a round trip of 2x the spin); a yield lets the peer run at
/// once. But a yield while a third task is runnable on this CPU (the other
/// worker, another process) puts this side behind it for its whole slice
/// (EEVDF: ~1.5 ms on 2 CPUs), long after the peer has answered; and a spin
/// for what comes only after the peer's own work (the next request of a
/// training step) is lost time on a CPU the peer needs. So a side whose
/// spins keep failing (a sleep, or a look that came back later than the
/// spin) sleeps at once, trying a spin again now and then.

#include <sched.h>

#include <chrono>
#include <cstdint>

namespace af {

class adaptive_spin {
public:
  /// Spins in a row that failed before the waits sleep at once; then one
  /// wait in this many spins again, and one that succeeds in time resumes them.
  static constexpr uint32_t misses_to_stop = 4;
  static constexpr uint32_t probe_every = 16;

  /// Looks at `ready()` between yields for at most `spin` (none if spins
  /// have been failing, but for a probe now and then): true if it held in time.
  template <class Ready>
  bool spin(std::chrono::microseconds spin, Ready&& ready) {
    using clock = std::chrono::steady_clock;
    if (spin.count() <= 0 || (misses_ >= misses_to_stop && ++skipped_ % probe_every != 0))
      return false;
    auto until = clock::now() + spin;
    for (;;) {
      if (ready()) {
        // In time: a look after a yield that came back late is not made
        // (the loop ends first, a miss).
        misses_ = 0;
        skipped_ = 0;
        return true;
      }
      sched_yield();
      if (clock::now() >= until)
        break;
    }
    ++misses_;
    return false;
  }

private:
  uint32_t misses_ = 0;  ///< spins in a row that ended in a sleep or took longer than the spin
  uint32_t skipped_ = 0; ///< waits that slept at once since
};

} // namespace af
