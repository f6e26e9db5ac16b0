#pragma once
/// A large elementwise pass (a ps's update of a 1 M-float variable: the
/// round's mean, the optimizer, the copy into the answer) split across the
/// cores. In a sync round every member waits for that pass, so on one core
/// it is the round's critical path while the others idle: on the 2-vCPU Xeon
/// the 1 M sync job ran about 11 % (shared memory) and 4 % (TCP) more steps a
/// second with the pass halved
/// (docs/performance.md, "The update split across the cores").
///
/// A few helper threads, made on first use and kept for the process, claim
/// blocks of the pass beside the caller (parallel_ranges below). One split
/// runs at a time: a caller that finds the helpers busy (another variable's
/// update on another thread) runs its whole range itself, so nothing ever
/// waits for a helper that is not working for it. Results cannot depend on
/// the split when `fn`'s ranges are independent (elementwise work): the
/// callers' own tests hold them to the one-range result bit for bit.
#include <atomic>
#include <cstddef>
#include <memory>
#include <type_traits>

namespace af {

/// Floats from which an elementwise pass is worth splitting, per range: 512
/// KiB, so that a 1 M-float pass runs on two threads or more and a small
/// one never pays a wake-up (a variable's update, a kernel's pass).
constexpr size_t elementwise_split_floats = size_t{1} << 17;

/// Threads a split uses, the caller's included: ACTORFLOW_UPDATE_THREADS if
/// set (1 turns splitting off; at most 8), else the cores this process may
/// run on (its affinity: taskset, a container's cpuset), at most
/// 4. Read once per process.
size_t parallel_threads();

/// Calls `fn(from, to)` on ranges that cover [0, n) once each, on up to
/// parallel_threads() threads, at most n / min_range of them (so n below
/// 2 x min_range is one call on the caller's thread). The ranges are blocks
/// of equal length, a multiple of `grain`, but the last (about a quarter of
/// a thread's share), which the caller and the helpers claim one at a time:
/// `fn` is called several times on a thread, on several threads at once,
/// each call with its own range, and a helper that wakes after the caller
/// claimed every block runs none (the caller never waits for a helper to be
/// scheduled, only for the blocks helpers hold). The helpers are kept off
/// the caller's core (and let onto it again if one is slow to end its
/// block). Returns once every range is done; an exception from a range is
/// thrown here, after every range in progress has ended, and no block is
/// claimed after it (one of them, if several threw).
template <class Fn>
void parallel_ranges(size_t n, size_t grain, size_t min_range, Fn&& fn);

/// parallel_ranges' untyped form (no allocation per call, as a
/// std::function of a capturing lambda would make): `call(context, from, to)`.
using range_call = void (*)(void* context, size_t from, size_t to);
void parallel_ranges_of(size_t n, size_t grain, size_t min_range, range_call call,
                        void* context);

/// What a test may do inside the splits (net/testing_hooks.hpp's way): the
/// one definition is the test binary's (tests/wire_test_hooks.cpp), weak
/// here, so that in a program there is none and nothing can set it.
struct parallel_hooks {
  /// When set: called on a helper's thread each time it wakes for a split,
  /// before it looks whether it may take part (no lock held). A test holds
  /// a helper there, as a busy core would.
  std::atomic<void (*)()> helper_woken{nullptr};
};
extern parallel_hooks parallel_hooks_of_tests __attribute__((weak));

/// How many splits parallel_ranges handed to its helpers (whether or not a
/// helper was free in time to take a block), in this
/// process so far (tests and benches see whether a pass was split).
size_t parallel_splits();

template <class Fn>
void parallel_ranges(size_t n, size_t grain, size_t min_range, Fn&& fn) {
  using F = std::remove_reference_t<Fn>;
  parallel_ranges_of(
    n, grain, min_range,
    [](void* context, size_t from, size_t to) { (*static_cast<F*>(context))(from, to); },
    const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
}

} // namespace af
