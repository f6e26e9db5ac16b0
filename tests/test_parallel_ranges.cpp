// core/parallel_ranges: a large elementwise pass split across the cores.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/parallel_ranges.hpp"
#include "core/usable_cores.hpp"

using namespace af;

namespace {

struct seen_ranges {
  std::mutex mtx;
  std::vector<std::pair<size_t, size_t>> ranges;
  std::set<std::thread::id> threads;

  void add(size_t from, size_t to) {
    std::lock_guard<std::mutex> guard{mtx};
    ranges.emplace_back(from, to);
    threads.insert(std::this_thread::get_id());
  }

  /// Whether the ranges cover [0, n) once each, every one but the last
  /// starting and ending at a multiple of `grain`.
  bool tile(size_t n, size_t grain) {
    std::sort(ranges.begin(), ranges.end());
    size_t at = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      auto [from, to] = ranges[i];
      if (from != at || to <= from || (i + 1 < ranges.size() && to % grain != 0))
        return false;
      at = to;
    }
    return at == n;
  }
};

} // namespace

TEST_CASE("parallel_ranges covers every index once, in blocks of whole grains, and counts the "
          "split",
          "[parallel]") {
  // Catches: a range lost or run twice at a split's edges or between blocks
  // (n = 11 in blocks of 2 leaves an eleventh index for a last, short
  // block), a block claimed twice, and a split not handed to the helpers.
  const size_t threads = parallel_threads();
  using sizes = std::tuple<size_t, size_t, size_t>; // n, grain, min_range
  auto [n, grain, min_range] =
    GENERATE(sizes{11, 1, 1}, sizes{7, 1, 1}, sizes{1'000'003, 4096, 1 << 17},
             sizes{(1 << 18) + 1, 4096, 1 << 17}, sizes{12'289, 4096, 1});
  CAPTURE(n, grain, min_range, threads);
  seen_ranges seen;
  const size_t before = parallel_splits();
  parallel_ranges(n, grain, min_range, [&](size_t from, size_t to) { seen.add(from, to); });
  CHECK(seen.tile(n, grain));
  const size_t parts = std::min(threads, n / min_range);
  // At most four blocks a thread: what claiming costs stays small. No more
  // threads than the split's (its seats), whatever the helpers.
  CHECK(seen.ranges.size() <= std::max<size_t>(4 * parts, 1));
  CHECK(seen.threads.size() <= std::max<size_t>(parts, 1));
  if (parts > 1) {
    // Nothing else in this test binary splits meanwhile.
    CHECK(parallel_splits() == before + 1);
    CHECK(seen.ranges.size() > 1);
  }
}

namespace {

/// Waits up to 10 s for `ready`, under `mtx`; whether it came.
template <class Pred>
bool wait_for(std::mutex& mtx, std::condition_variable& cv, Pred ready) {
  std::unique_lock<std::mutex> lock{mtx};
  return cv.wait_for(lock, std::chrono::seconds{10}, ready);
}

/// The helpers' hook for the test below: holds each woken helper until the
/// test lets it go (or 10 s pass).
struct held_helpers {
  static inline std::mutex mtx;
  static inline std::condition_variable cv;
  static inline bool let_go = false;
  static inline bool timed_out = false;
  static inline int passed = 0;

  static void hold() {
    std::unique_lock<std::mutex> lock{mtx};
    if (!cv.wait_for(lock, std::chrono::seconds{10}, [] { return let_go; }))
      timed_out = true;
    passed += 1;
    cv.notify_all();
  }
};

} // namespace

TEST_CASE("a split whose helpers are not scheduled in time runs on its caller, which does not wait "
          "for them, and a helper that wakes after it runs nothing of it",
          "[parallel]") {
  // Catches: one fixed range a thread, where the caller, its own range done,
  // waited for a helper that its busy core had not run yet (on two vCPUs
  // the ps's update ran on one core while the other idled); and a helper
  // that wakes after the split ended and still calls into it (its function
  // is gone: a crash) or into the next one twice (indices counted twice).
  if (parallel_threads() < 2) {
    WARN("one thread a split (one core, or ACTORFLOW_UPDATE_THREADS=1): no helper, nothing to "
         "check");
    return;
  }
  const size_t n = 1 << 20;
  std::vector<unsigned char> hits(n);
  std::set<std::thread::id> threads;
  std::mutex threads_mtx;
  held_helpers::let_go = false;
  held_helpers::timed_out = false;
  held_helpers::passed = 0;
  parallel_hooks_of_tests.helper_woken.store(&held_helpers::hold);
  parallel_ranges(n, 4096, 1 << 17, [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i)
      hits[i] += 1;
    std::lock_guard<std::mutex> guard{threads_mtx};
    threads.insert(std::this_thread::get_id());
  });
  bool held_still;
  {
    std::lock_guard<std::mutex> lock{held_helpers::mtx};
    held_still = !held_helpers::timed_out; // the split returned while its helpers were held
    held_helpers::let_go = true;
  }
  held_helpers::cv.notify_all();
  CHECK(held_still);
  CHECK(threads == std::set<std::thread::id>{std::this_thread::get_id()});
  // Every helper that was woken now looks at a split that has ended.
  const auto woken = static_cast<int>(parallel_threads()) - 1;
  CHECK(wait_for(held_helpers::mtx, held_helpers::cv,
                 [&] { return held_helpers::passed >= woken; }));
  parallel_hooks_of_tests.helper_woken.store(nullptr);
  seen_ranges seen;
  parallel_ranges(n, 4096, 1 << 17, [&](size_t from, size_t to) { seen.add(from, to); });
  CHECK(seen.tile(n, 4096));
  CHECK(std::all_of(hits.begin(), hits.end(), [](unsigned char h) { return h == 1; }));
}

TEST_CASE("a split's helpers run on the cores other than its caller's, and take blocks while the "
          "caller is busy",
          "[parallel]") {
  // Catches: a helper woken onto its caller's core, where the kernel puts it
  // when the cores are busy on average (it skips its search for an idle
  // one): it preempts the caller and the split runs on one core; and a
  // split that never reaches a second thread.
  if (parallel_threads() < 2 || usable_cores() < 2) {
    WARN("one thread a split or one core: no helper or no other core, nothing to check");
    return;
  }
  cpu_set_t all;
  REQUIRE(sched_getaffinity(0, sizeof(all), &all) == 0);
  int mine = 0;
  while (!CPU_ISSET(mine, &all))
    ++mine;
  std::mutex mtx;
  std::condition_variable cv;
  bool helper_ran = false;
  cpu_set_t helper_cores;
  CPU_ZERO(&helper_cores);
  const size_t n = 1 << 20;
  bool waited = true, pinned = false;
  // The caller: a thread of its own pinned to one core (the process's main
  // thread keeps them all: the helpers' cores are the process's).
  std::thread caller_thread{[&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(mine, &one);
    pinned = sched_setaffinity(0, sizeof(one), &one) == 0; // this thread only
    const auto caller = std::this_thread::get_id();
    parallel_ranges(n, 4096, 1 << 17, [&](size_t from, size_t) {
      if (std::this_thread::get_id() == caller) {
        if (from == 0) // the caller's first block: until a helper has taken one
          waited = wait_for(mtx, cv, [&] { return helper_ran; });
        return;
      }
      std::lock_guard<std::mutex> lock{mtx};
      if (!helper_ran)
        sched_getaffinity(0, sizeof(helper_cores), &helper_cores);
      helper_ran = true;
      cv.notify_all();
    });
  }};
  caller_thread.join();
  if (!pinned) {
    WARN("this system refuses a thread's affinity: nothing to check");
    return;
  }
  CHECK(waited); // a helper took a block while the caller was busy
  CHECK_FALSE(CPU_ISSET(mine, &helper_cores));
  CHECK(CPU_COUNT(&helper_cores) == CPU_COUNT(&all) - 1);
}

TEST_CASE("parallel_ranges runs a pass below two ranges' worth as one call on the caller's thread",
          "[parallel]") {
  // Catches: a small update paying a helper's wake-up (a digits variable
  // split), or a split into ranges shorter than asked for.
  seen_ranges seen;
  const size_t before = parallel_splits();
  const size_t n = (1 << 18) - 1;
  parallel_ranges(n, 4096, 1 << 17, [&](size_t from, size_t to) { seen.add(from, to); });
  REQUIRE(seen.ranges.size() == 1);
  CHECK(seen.ranges[0] == std::pair<size_t, size_t>{0, n});
  CHECK(*seen.threads.begin() == std::this_thread::get_id());
  CHECK(parallel_splits() == before);
  parallel_ranges(0, 4096, 1, [&](size_t, size_t) { seen.add(0, 0); });
  CHECK(seen.ranges.size() == 1); // n = 0: no call
}

TEST_CASE("an exception in any range of a split comes out of parallel_ranges after every range in "
          "progress has ended, and the next split still runs",
          "[parallel]") {
  // Catches: an exception on a helper thread ending the process (thrown out
  // of the thread's function), or the caller returning while a helper still
  // writes, or a helper left counting a split that already ended.
  if (parallel_threads() < 2) {
    WARN("one thread a split (one core, or ACTORFLOW_UPDATE_THREADS=1): no helper to throw on, "
         "nothing to check");
    return;
  }
  const size_t n = 1 << 20;
  const size_t thrower = GENERATE(0, 1); // the first block, then every other one
  std::atomic<int> running{0};
  std::vector<float> out(n);
  auto pass = [&](size_t from, size_t to) {
    running += 1;
    if ((from == 0) == (thrower == 0)) {
      running -= 1;
      throw std::runtime_error("range " + std::to_string(from) + " failed");
    }
    for (size_t i = from; i < to; ++i) // long enough for the throw to overtake it
      out[i] = std::sqrt(static_cast<float>(i)) + out[i];
    running -= 1;
  };
  CHECK_THROWS_WITH(parallel_ranges(n, 4096, 1 << 17, pass),
                    Catch::Matchers::StartsWith("range"));
  CHECK(running.load() == 0); // no range still writing once the throw came out
  seen_ranges seen;
  parallel_ranges(n, 4096, 1 << 17, [&](size_t from, size_t to) { seen.add(from, to); });
  CHECK(seen.tile(n, 4096));
}

TEST_CASE("parallel_ranges from several threads at once: each call covers its own range, one split "
          "at a time and the others on their callers",
          "[parallel]") {
  // Catches: two callers' splits mixed in the helpers (one caller's range
  // run with the other's function, or a caller waiting for the other's
  // helpers), which loses or doubles indices.
  const size_t n = 1 << 19;
  constexpr int callers = 3, rounds = 60;
  std::vector<std::vector<unsigned char>> hits(callers, std::vector<unsigned char>(n));
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c)
    threads.emplace_back([&, c] {
      for (int r = 0; r < rounds; ++r)
        parallel_ranges(n, 4096, 1 << 17, [&](size_t from, size_t to) {
          for (size_t i = from; i < to; ++i)
            hits[c][i] += 1;
        });
    });
  for (auto& t : threads)
    t.join();
  for (int c = 0; c < callers; ++c) {
    CAPTURE(c);
    CHECK(std::all_of(hits[c].begin(), hits[c].end(), [](unsigned char h) { return h == rounds; }));
  }
}

TEST_CASE("a child of fork() after a split runs its own splits on its caller, not waiting for the "
          "parent's helpers, which it does not have",
          "[parallel]") {
  // Catches: the pthread_atfork mark lost, so that the child hands ranges to
  // helpers that exist only in the parent and waits for them for good.
  ::setenv("ACTORFLOW_UPDATE_THREADS", "2", 0); // a helper even on one core, if read first here
  if (parallel_threads() < 2) {
    WARN("ACTORFLOW_UPDATE_THREADS=1: no helpers, nothing to check");
    return;
  }
  const size_t n = 1 << 19;
  std::vector<unsigned char> hits(n);
  auto pass = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i)
      hits[i] += 1;
  };
  const size_t before = parallel_splits();
  parallel_ranges(n, 4096, 1 << 17, pass); // the parent's helpers now exist
  REQUIRE(parallel_splits() == before + 1);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) { // only what is safe after fork: no allocation, no Catch
    ::close(fds[0]);
    parallel_ranges(n, 4096, 1 << 17, pass);
    char ok = std::all_of(hits.begin(), hits.end(), [](unsigned char h) { return h == 2; }) ? 'y'
                                                                                           : 'n';
    ssize_t w = ::write(fds[1], &ok, 1);
    ::_exit(w == 1 ? 0 : 1);
  }
  ::close(fds[1]);
  pollfd pfd{fds[0], POLLIN, 0};
  int ready = ::poll(&pfd, 1, 20000); // the child's pass takes milliseconds
  char got = 0;
  if (ready == 1)
    REQUIRE(::read(fds[0], &got, 1) >= 0);
  else
    ::kill(child, SIGKILL);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(ready == 1); // else the child waited for helpers it does not have
  CHECK(got == 'y');
  // The parent's helpers still work.
  parallel_ranges(n, 4096, 1 << 17, pass);
  CHECK(parallel_splits() == before + 2);
  CHECK(std::all_of(hits.begin(), hits.end(), [](unsigned char h) { return h == 2; }));
}
