#include "core/parallel_ranges.hpp"
#include "core/usable_cores.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>
#include <sched.h>

namespace af {

namespace {

size_t threads_from_environment() {
  const size_t cores = usable_cores();
  const size_t automatic = std::min<size_t>(cores, 4);
  const char* v = std::getenv("ACTORFLOW_UPDATE_THREADS");
  if (v == nullptr || *v == '\0')
    return automatic;
  char* end = nullptr;
  unsigned long k = std::strtoul(v, &end, 10);
  if (*v < '0' || *v > '9' || *end != '\0' || k < 1 || k > 8) {
    std::fprintf(stderr,
                 "actorflow: ACTORFLOW_UPDATE_THREADS='%s' is not a count of threads from 1 to 8 "
                 "(1: no split): taken as %zu, the cores this process may run on (at most 4)\n",
                 v, automatic);
    return automatic;
  }
  return static_cast<size_t>(k);
}

/// Set in a child of fork(): it has none of its parent's helpers.
std::atomic<bool> forked_child{false};

/// The helpers and the one split they work on. Never destroyed: a helper
/// may still sleep in it while the process exits.
struct pool {
  std::mutex turn; // held by the caller of the split in progress
  std::mutex mtx;  // what follows
  std::condition_variable work, done;
  size_t helpers = 0;
  bool start_failed = false;
  uint64_t generation = 0;
  range_call call = nullptr;
  void* context = nullptr;
  std::vector<std::pair<size_t, size_t>> ranges; // [0] is the caller's
  size_t pending = 0;
  std::exception_ptr error;
  std::atomic<size_t> splits{0};

  void serve(size_t index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock{mtx};
    for (;;) {
      work.wait(lock, [&] { return generation != seen; });
      seen = generation;
      if (index >= ranges.size())
        continue; // a split of fewer ranges: not this helper's
      auto [from, to] = ranges[index];
      auto f = call;
      auto c = context;
      lock.unlock();
      std::exception_ptr err;
      try {
        f(c, from, to);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err && !error)
        error = err;
      if (--pending == 0)
        done.notify_one();
    }
  }

  /// Starts the helpers once (turn held); false if the system would not.
  /// Allocates nothing once they run (ranges reserved here): a split cannot
  /// fail for want of memory after its caller began writing (apply_blocks'
  /// fresh buffer, copy on write, would be left unwritten).
  bool started(size_t wanted) {
    if (helpers >= wanted)
      return true;
    if (start_failed)
      return false;
    try {
      {
        std::lock_guard<std::mutex> lock{mtx}; // a helper reads ranges meanwhile
        ranges.reserve(wanted + 1);
      }
      while (helpers < wanted) {
        std::thread{[this, index = helpers + 1] { serve(index); }}.detach();
        ++helpers;
      }
    } catch (const std::system_error&) {
      start_failed = true; // out of threads: every split runs on its caller
    } catch (const std::bad_alloc&) {
      return false; // this split runs on its caller; a later one tries again
    }
    return helpers >= wanted;
  }
};

pool& the_pool() {
  // In static storage, not from new: making it cannot throw bad_alloc.
  alignas(pool) static unsigned char storage[sizeof(pool)];
  static pool& p = [] () -> pool& {
    auto* made = new (storage) pool;
    // The child's handler touches only an atomic (not the_pool(), whose
    // one-time setup another thread may be in at the fork). Without the
    // handler a child could wait for helpers it does not have: no splits.
    if (pthread_atfork(nullptr, nullptr, [] { forked_child.store(true); }) != 0)
      made->start_failed = true;
    return *made;
  }();
  return p;
}

} // namespace

size_t parallel_threads() {
  static const size_t threads = threads_from_environment();
  return threads;
}

size_t parallel_splits() {
  return the_pool().splits.load();
}

void parallel_ranges_of(size_t n, size_t grain, size_t min_range, range_call call,
                        void* context) {
  auto fn = [call, context](size_t from, size_t to) { call(context, from, to); };
  grain = std::max<size_t>(grain, 1);
  size_t parts = std::min(parallel_threads(), n / std::max<size_t>(min_range, 1));
  if (parts <= 1) {
    if (n > 0)
      fn(0, n);
    return;
  }
  auto& p = the_pool();
  std::unique_lock<std::mutex> turn{p.turn, std::defer_lock};
  if (forked_child.load() || !turn.try_lock() || !p.started(parts - 1)) {
    fn(0, n); // the helpers work for another caller, or are not there
    return;
  }
  // At most `parts` ranges: each ceil(n / parts), rounded up to the grain.
  const size_t step = ((n + parts - 1) / parts + grain - 1) / grain * grain;
  {
    std::lock_guard<std::mutex> lock{p.mtx};
    p.ranges.clear();
    for (size_t from = 0; from < n; from += step)
      p.ranges.emplace_back(from, std::min(n, from + step));
    p.call = call;
    p.context = context;
    p.pending = p.ranges.size() - 1;
    p.error = nullptr;
    ++p.generation;
  }
  p.work.notify_all();
  std::exception_ptr own;
  try {
    fn(p.ranges[0].first, p.ranges[0].second);
  } catch (...) {
    own = std::current_exception();
  }
  // No timeout: each helper runs one range of `fn`, as this thread would
  // have, and a wait given up could not stop it writing the caller's memory.
  std::unique_lock<std::mutex> lock{p.mtx};
  p.done.wait(lock, [&] { return p.pending == 0; });
  p.call = nullptr;
  p.context = nullptr;
  auto err = own ? own : p.error;
  p.error = nullptr;
  lock.unlock();
  p.splits.fetch_add(1);
  if (err)
    std::rethrow_exception(err);
}

} // namespace af
