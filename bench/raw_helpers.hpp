#pragma once
// What the helper processes of the training metrics share
// (train_helpers.cpp, raw_shm_ps.cpp): their arguments, how long they wait
// for a peer, and the raw parameter servers' timed window.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "bench/stats.hpp"

namespace af::bench {

/// How long a baseline's socket may make no progress before the helper
/// gives up (a peer that died or hung): the bench then reports the failure
/// instead of waiting for its own timeout.
constexpr int stall_ms = 30000;

/// key=value arguments of a helper.
struct helper_args {
  std::map<std::string, std::string> kv;

  std::string str(const std::string& key) const {
    auto i = kv.find(key);
    if (i == kv.end()) {
      std::fprintf(stderr, "actorflow-bench helper: missing %s=\n", key.c_str());
      std::exit(2);
    }
    return i->second;
  }
  uint64_t num(const std::string& key) const { return std::stoull(str(key)); }
  double real(const std::string& key) const { return std::stod(str(key)); }
};

/// The timed window of a raw ps (the same as actorflow-train's warmup_secs
/// and window_secs): the warm-up starts once every worker has finished a
/// step, the window's steps are counted between two samples, and then the
/// ps ends the run, closing each connection at the end of its step.
struct raw_window {
  double warmup_s = 5, window_s = 15;
  bool started = false, ending = false;
  clock_type::time_point both, t0, t1;
  uint64_t steps0 = 0, steps1 = 0;

  /// Called once per pass of the ps's loop with the steps the job completed
  /// so far (sync: rounds; async: pushes answered) and whether every worker
  /// has finished a step.
  void tick(uint64_t steps, bool all_stepped) {
    if (ending)
      return;
    auto now = clock_type::now();
    if (!started) {
      if (!all_stepped)
        return;
      started = true;
      both = now;
      t0 = both + std::chrono::duration_cast<clock_type::duration>(
                    std::chrono::duration<double>(warmup_s));
      t1 = clock_type::time_point::max();
      return;
    }
    if (t1 == clock_type::time_point::max()) {
      if (now < t0)
        return;
      t0 = now;
      steps0 = steps;
      t1 = t0 + std::chrono::duration_cast<clock_type::duration>(
                  std::chrono::duration<double>(window_s));
      return;
    }
    if (now < t1)
      return;
    t1 = now;
    steps1 = steps;
    ending = true;
  }
  /// How long poll() may wait before the next tick is due (the window's
  /// edges are read on the clock, not only when a byte moves).
  int poll_ms() const {
    if (!started || ending)
      return stall_ms;
    auto next = t1 == clock_type::time_point::max() ? t0 : t1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - clock_type::now());
    return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, stall_ms));
  }
};

/// The raw shared-memory ps and its workers (raw_shm_ps.cpp): shm= names the
/// segment, which the bench makes (raw_shm_segment_bytes, zeros) and removes.
int raw_shm_ps_main(const helper_args& a);
int raw_shm_worker_main(const helper_args& a);

/// The size of the segment of `workers` workers of a model of `floats`.
size_t raw_shm_segment_bytes(size_t floats, size_t workers);

} // namespace af::bench
