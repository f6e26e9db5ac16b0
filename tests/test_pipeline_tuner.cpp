// pipeline_sync = "auto"'s choice (dist/pipeline_tuner.hpp) with a fake clock:
// both kinds of sync round timed, the faster kept, the other timed again
// after a hold that doubles while the choice stands, and store-and-forward
// where no pipelined round ever comes.
#include <catch2/catch.hpp>

#include <string>

#include "dist/pipeline_tuner.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

/// Rounds fed to a tuner on a fake clock: each round of the kind the tuner
/// wants takes that kind's period (workers that follow at once).
struct feed {
  pipeline_tuner t;
  pipeline_tuner::clock::time_point now{};
  std::chrono::microseconds pipelined{3000}, whole{4000};
  std::string last_line;
  int lines = 0;

  explicit feed(pipeline_tuner::settings s) : t(s) {
    // nop
  }

  /// One round of the kind the tuner wants (or `kind`, if given).
  void round(int kind = -1) {
    bool p = kind < 0 ? t.pipelined() : kind == 1;
    now += p ? pipelined : whole;
    auto line = t.round_closed(now, p);
    if (!line.empty()) {
      last_line = line;
      lines += 1;
    }
  }

  void rounds(int n) {
    for (int i = 0; i < n; ++i)
      round();
  }

  /// Rounds (at most 1000) until the tuner's state() is `state`.
  int rounds_until(const std::string& state) {
    int n = 0;
    while (t.state() != state && n < 1000) {
      round();
      n += 1;
    }
    return n;
  }
};

pipeline_tuner::settings small() {
  pipeline_tuner::settings s;
  s.warm_up = 0;
  s.settle = 2;
  s.probe = 5;
  s.first_hold = 20;
  s.max_hold = 80;
  return s;
}

} // namespace

TEST_CASE("the pipeline tuner keeps the faster kind of round, pipelined or store-and-forward",
          "[pipeline][tuner]") {
  // Catches: a tuner that keeps the first kind it timed, compares the wrong
  // medians, or times a kind with the rounds of the other.
  const bool pipelined_faster = GENERATE(true, false);
  CAPTURE(pipelined_faster);
  feed f{small()};
  if (!pipelined_faster)
    std::swap(f.pipelined, f.whole);
  CHECK(f.t.pipelined()); // pipelined rounds are timed first
  CHECK(f.t.state() == "timing pipelined rounds");
  f.rounds(2 + 5); // settle (the first round, which has no period, is one), then probe
  CHECK_FALSE(f.t.pipelined());
  CHECK(f.t.state() == "timing store-and-forward rounds");
  CHECK(f.lines == 0);
  f.rounds(1 + 5);
  CHECK(f.lines == 0);
  f.round();
  CHECK(f.t.pipelined() == pipelined_faster);
  CHECK(f.t.state() == (pipelined_faster ? "pipelined rounds" : "store-and-forward rounds"));
  CHECK(f.lines == 1);
  CHECK_THAT(f.last_line, Catch::Contains(pipelined_faster ? "chose pipelined rounds"
                                                           : "chose store-and-forward rounds"));
  CHECK(f.t.pipelined_ms() == Approx(pipelined_faster ? 3.0 : 4.0));
  CHECK(f.t.whole_ms() == Approx(pipelined_faster ? 4.0 : 3.0));
}

TEST_CASE("the pipeline tuner times only rounds of the kind it asked for, after the settling ones",
          "[pipeline][tuner]") {
  // Catches: periods of rounds the workers made before they followed (or of
  // the settling rounds) taken for the asked kind's.
  auto s = small();
  s.probe = 2; // the median of two is the larger: any slow period counted shows
  feed f{s};
  f.pipelined = 50000us;
  f.round(1); // no period yet: the first settling round
  f.round(1); // the second: 50 ms, not timed
  f.round(0); // workers that have not followed: 4 ms each, not timed
  f.round(0);
  f.pipelined = 3000us;
  f.round(1);
  f.round(1);
  CHECK(f.t.state() == "timing store-and-forward rounds");
  CHECK(f.t.pipelined_ms() == Approx(3.0));
  f.rounds(2 + 2);
  CHECK(f.t.state() == "pipelined rounds");
}

TEST_CASE("the pipeline tuner keeps store-and-forward on a tie, and pipelined only beyond its "
          "margin",
          "[pipeline][tuner]") {
  // Catches: a tie that picks pipelined, the round that costs more CPU.
  feed f{small()};
  f.pipelined = 3850us; // 3.75 % faster: within the 5 % margin
  f.whole = 4000us;
  f.rounds(7 + 7);
  CHECK(f.t.state() == "store-and-forward rounds");
  feed g{small()};
  g.pipelined = 3700us; // 7.5 % faster
  g.whole = 4000us;
  g.rounds(7 + 7);
  CHECK(g.t.state() == "pipelined rounds");
}

TEST_CASE("the pipeline tuner times the other kind again after its hold, which doubles while the "
          "choice stands, and follows a machine that changed",
          "[pipeline][tuner]") {
  // Catches: a choice made once for good (a job that moved to other
  // links keeps the slower kind), and re-timing at a fixed period.
  feed f{small()};
  f.rounds(7 + 7); // pipelined (3 ms against 4)
  REQUIRE(f.t.state() == "pipelined rounds");
  auto rounds_until_timing = [&] { return f.rounds_until("timing store-and-forward rounds"); };
  CHECK(rounds_until_timing() == 20); // first_hold
  f.rounds(7);                         // store-and-forward timed: still slower
  CHECK(f.t.state() == "pipelined rounds");
  CHECK(f.lines == 1); // a choice that stands is not logged again
  CHECK(rounds_until_timing() == 40); // doubled
  f.rounds(7);
  CHECK(rounds_until_timing() == 80); // max_hold
  f.rounds(7);
  CHECK(rounds_until_timing() == 80);
  // The machine changes: store-and-forward is now the faster.
  f.whole = 2000us;
  f.rounds(7);
  CHECK(f.t.state() == "store-and-forward rounds");
  CHECK(f.lines == 2);
  CHECK_THAT(f.last_line, Catch::Contains("chose store-and-forward rounds"));
  // Its hold starts again at first_hold, then pipelined is timed anew, with
  // the held kind's figure from its latest rounds.
  CHECK(f.rounds_until("timing pipelined rounds") == 20);
  CHECK(f.t.whole_ms() == Approx(2.0));
}

TEST_CASE("the pipeline tuner settles on store-and-forward where no pipelined round comes",
          "[pipeline][tuner]") {
  // Catches: a tuner that asks for pipelined rounds forever where the
  // pushes cannot stream (shared memory, TLS) or the rounds cannot be
  // pipelined (backup workers), and says nothing about it.
  feed f{small()};
  int n = 0;
  while (f.t.pipelined() && n < 1000) {
    f.round(0);
    n += 1;
  }
  CHECK(n == 4 * (2 + 5));
  CHECK(f.t.state() == "store-and-forward rounds");
  CHECK_THAT(f.last_line, Catch::Contains("no pipelined round came in 28 rounds"));
}

TEST_CASE("the pipeline tuner times nothing in a job's first rounds", "[pipeline][tuner]") {
  // Catches: the first rounds (pages, buffers and socket windows still
  // growing) timed as pipelined ones, the kind timed first.
  auto s = small();
  s.warm_up = 4;
  s.probe = 2;
  feed f{s};
  f.pipelined = 50000us;
  f.rounds(4); // warm-up: 50 ms each, not timed
  f.pipelined = 3000us;
  f.rounds(2 + 2);
  CHECK(f.t.state() == "timing store-and-forward rounds");
  CHECK(f.t.pipelined_ms() == Approx(3.0));
}
