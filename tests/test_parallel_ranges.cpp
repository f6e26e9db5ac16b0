// core/parallel_ranges: a large elementwise pass split across the cores.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/parallel_ranges.hpp"

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

TEST_CASE("parallel_ranges covers every index once, in at most one range per thread, each on its "
          "own thread where there are cores",
          "[parallel]") {
  // Catches: a range lost or run twice at a split's edges, more ranges than
  // helpers (a split of n = 11 into two ranges of 5 left an eleventh index
  // for a third range no helper took: the caller waited for good), and a
  // split that never reaches a second thread.
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
  CHECK(seen.ranges.size() <= std::max<size_t>(parts, 1));
  if (parts > 1) {
    // Nothing else in this test binary splits meanwhile: these ranges were
    // spread over the helpers.
    CHECK(parallel_splits() == before + 1);
    CHECK(seen.threads.size() == seen.ranges.size());
    CHECK(seen.ranges.size() > 1);
  }
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

TEST_CASE("an exception in any range of a split comes out of parallel_ranges after every range has "
          "ended, and the next split still runs",
          "[parallel]") {
  // Catches: an exception on a helper thread ending the process (thrown out
  // of the thread's function), or the caller returning while a helper still
  // writes, or a helper left counting a split that already ended.
  if (parallel_threads() < 2) {
    WARN("one core: no helper to throw on, nothing to check");
    return;
  }
  const size_t n = 1 << 20;
  const size_t thrower = GENERATE(0, 1); // the caller's range, then a helper's
  std::atomic<size_t> ended{0};
  auto pass = [&](size_t from, size_t to) {
    if ((from == 0) == (thrower == 0))
      throw std::runtime_error("range " + std::to_string(from) + " failed");
    ended += to - from;
  };
  CHECK_THROWS_WITH(parallel_ranges(n, 4096, 1 << 17, pass),
                    Catch::Matchers::StartsWith("range"));
  CHECK(ended.load() > 0); // the other range ran to its end before the throw came out
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
