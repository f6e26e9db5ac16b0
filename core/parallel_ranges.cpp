#include "core/parallel_ranges.hpp"
#include "core/usable_cores.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
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
#include <unistd.h>

namespace af {

namespace {

/// Blocks a split is cut into per thread (core/parallel_ranges.hpp).
constexpr size_t blocks_per_thread = 4;

/// The most threads a split uses, the caller's included.
constexpr size_t max_threads = 8;

/// How long a caller that has claimed every block waits for the helpers'
/// last blocks (about a block's time) before it lets them off their cores.
constexpr std::chrono::microseconds helper_patience{500};

size_t threads_from_environment() {
  const size_t cores = usable_cores();
  const size_t automatic = std::min<size_t>(cores, 4);
  const char* v = std::getenv("ACTORFLOW_UPDATE_THREADS");
  if (v == nullptr || *v == '\0')
    return automatic;
  char* end = nullptr;
  unsigned long k = std::strtoul(v, &end, 10);
  if (*v < '0' || *v > '9' || *end != '\0' || k < 1 || k > max_threads) {
    std::fprintf(stderr,
                 "actorflow: ACTORFLOW_UPDATE_THREADS='%.40s' is not a count of threads from 1 to 8 "
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
///
/// A split is a row of blocks that the caller and the helpers claim one at a
/// time (`next`), so that a thread that runs slower (its data out of cache,
/// another process on its core) takes fewer of them, and a helper that has
/// not started yet when the caller has claimed every block takes none: the
/// caller closes the split (`open`) and waits only for the helpers inside it
/// (`inside`), each finishing the block it holds. On two vCPUs shared by a
/// ps and its workers a helper's core is often busy; with one fixed range
/// per thread the caller waited for it to be scheduled.
struct pool {
  std::mutex turn; // held by the caller of the split in progress; guards these:
  size_t helpers = 0;
  bool start_failed = false;
  std::vector<pthread_t> threads; // the helpers'
  cpu_set_t cores;                // the process's cores when the first helper started
  int kept_off = -1;              // the core the helpers were last kept off

  // Guards what follows but `next`. A thread of the split reads n, block and
  // blocks without it: they are written only while no helper is inside a
  // split (before `open`; the caller returns after `inside` is 0).
  std::mutex mtx;
  std::condition_variable work, done;
  uint64_t generation = 0;
  bool open = false;  // helpers may join the split in progress
  size_t seats = 0;   // how many more of them may (its threads less the caller)
  size_t inside = 0;  // helpers inside it: each holds a block, or claims its next
  range_call call = nullptr;
  void* context = nullptr;
  size_t n = 0, block = 0, blocks = 0;
  std::atomic<size_t> next{0}; // the next block to claim (blocks or more: none left)
  std::exception_ptr error;
  std::atomic<size_t> splits{0};

  /// Runs block `k` (a claimed one, or none if it is `blocks` or more), then
  /// claims and runs more until none is left (or one threw: then no one
  /// claims more). Every thread of the split runs this.
  void run_blocks(size_t k, range_call f, void* c, std::exception_ptr& err) {
    for (;; k = next.fetch_add(1, std::memory_order_relaxed)) {
      if (k >= blocks)
        return;
      try {
        f(c, k * block, std::min(n, (k + 1) * block));
      } catch (...) {
        err = std::current_exception();
        next.store(blocks, std::memory_order_relaxed); // the others stop at their block's end
        return;
      }
    }
  }

  void serve() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock{mtx};
    for (;;) {
      work.wait(lock, [&] { return generation != seen; });
      seen = generation;
      if (&parallel_hooks_of_tests != nullptr) { // a test binary's: never in a program
        if (auto hook = parallel_hooks_of_tests.helper_woken.load()) {
          lock.unlock();
          hook();
          lock.lock();
        }
      }
      if (!open || seats == 0)
        continue; // the caller took every block before this helper woke, or enough helpers did
      // The first block is claimed under the lock: a helper is counted
      // inside (and waited for) only while it holds one.
      size_t first = next.fetch_add(1, std::memory_order_relaxed);
      if (first >= blocks)
        continue;
      --seats;
      ++inside;
      auto f = call;
      auto c = context;
      lock.unlock();
      std::exception_ptr err;
      run_blocks(first, f, c, err);
      lock.lock();
      if (err && !error)
        error = err;
      if (--inside == 0)
        done.notify_one();
    }
  }

  /// Starts the helpers once (turn held); false if the system would not.
  /// Allocates nothing once they run: a split cannot fail for want of memory
  /// after its caller began writing (apply_blocks' fresh buffer, copy on
  /// write, would be left unwritten).
  bool started(size_t wanted) {
    if (helpers >= wanted)
      return true;
    if (start_failed)
      return false;
    try {
      if (helpers == 0) {
        // The process's cores: its main thread's (taskset's), not the
        // caller's, which may be pinned to one.
        CPU_ZERO(&cores);
        if (sched_getaffinity(::getpid(), sizeof(cores), &cores) != 0)
          CPU_ZERO(&cores); // no mask: the helpers are not steered (keep_off does nothing)
        threads.reserve(max_threads); // at most max_threads - 1 helpers
      }
      while (helpers < wanted) {
        std::thread helper{[this] { serve(); }};
        threads.push_back(helper.native_handle()); // reserved: cannot throw
        helper.detach();
        ++helpers;
        kept_off = -1; // the new one is not steered yet
      }
    } catch (const std::system_error&) {
      start_failed = true; // out of threads: every split runs on its caller
    } catch (const std::bad_alloc&) {
      return false; // this split runs on its caller; a later one tries again
    }
    return helpers >= wanted;
  }

  /// Lets the helpers run anywhere but on core `cpu` (the caller's), turn
  /// held. Woken by the caller, a helper goes to the caller's core by
  /// default where the kernel's search for an idle core is cut short (its
  /// SIS_UTIL skips the search while the cores are busy on average, as the
  /// 1 M sync job keeps two vCPUs 80 % busy): there it preempts the caller,
  /// and the split runs on one core while the other idles. A hint: a
  /// failure (a core taken away meanwhile) leaves the helpers where they were.
  void keep_off(int cpu) {
    if (cpu < 0 || cpu == kept_off || CPU_COUNT(&cores) < 2 || !CPU_ISSET(cpu, &cores))
      return;
    cpu_set_t others = cores;
    CPU_CLR(cpu, &others);
    bool all = true;
    for (auto t : threads) // detached, but never ending: the handles stay valid
      all = pthread_setaffinity_np(t, sizeof(others), &others) == 0 && all;
    kept_off = all ? cpu : -1; // a failure is tried again at the next split
  }

  /// The helpers on all the process's cores again (turn held): one that
  /// another process preempted on its one allowed core in the middle of a
  /// block may then move to the caller's, which waits for it.
  void let_anywhere() {
    if (kept_off < 0)
      return;
    for (auto t : threads)
      pthread_setaffinity_np(t, sizeof(cores), &cores);
    kept_off = -1;
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
  // Blocks of about a quarter of a thread's share, rounded up to the grain:
  // few enough that claiming costs nothing, small enough that the threads
  // end within a block of each other.
  const size_t per_block = (n + parts * blocks_per_thread - 1) / (parts * blocks_per_thread);
  const size_t block = (per_block + grain - 1) / grain * grain;
  p.keep_off(sched_getcpu());
  {
    std::lock_guard<std::mutex> lock{p.mtx};
    p.call = call;
    p.context = context;
    p.n = n;
    p.block = block;
    p.blocks = (n + block - 1) / block;
    p.next.store(0, std::memory_order_relaxed);
    p.error = nullptr;
    p.open = true;
    p.seats = parts - 1;
    ++p.generation;
  }
  p.work.notify_all(); // the helpers: this split needs at most parts - 1 of them
  std::exception_ptr own;
  p.run_blocks(p.next.fetch_add(1, std::memory_order_relaxed), call, context, own);
  // Every block is claimed: close the split and wait for the helpers inside
  // it, each at the end of its block. No timeout: a helper runs `fn` as this
  // thread would have, and a wait given up could not stop it writing the
  // caller's memory. Helpers that wake after this see the split closed.
  std::unique_lock<std::mutex> lock{p.mtx};
  p.open = false;
  if (!p.done.wait_for(lock, helper_patience, [&] { return p.inside == 0; })) {
    // A helper is slow to end its block: another process may have taken its
    // core. Let it run on any core again (this one is about to idle).
    lock.unlock();
    p.let_anywhere();
    lock.lock();
    p.done.wait(lock, [&] { return p.inside == 0; });
  }
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
