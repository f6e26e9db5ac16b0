#pragma once
/// The training benchmarks of actorflow-bench (issues 8 and 24). Each
/// measures actorflow-train's processes (1 ps + 2 workers on loopback) or the
/// all-reduce group against hand-written raw code in processes of the same
/// shape, on the transport its name says, alternating repetitions so that
/// both sample the same stretch of time, and prints `metric NAME ours=X
/// baseline=Y unit=U ratio=Z` (a `#` line before it says what each side is):
///
///   train_sync_1m_2w_tcp        sync steps/s of the 1 M workload (docs/training.md)
///                               over TCP, against the raw-TCP store-and-forward
///                               ps (the pipelined raw ps's figure as a # line)
///   train_async_1m_2w_tcp       async global steps/s, the same
///   train_sync_1m_2w_shm        the sync job on shared memory, against a raw
///                               shared-memory store-and-forward ps (raw_shm_ps.cpp)
///   train_sync_1m_2w_shm_vs_tcp the sync job on shared memory against itself on TCP
///   allreduce_4mib_2w_*         all-reduce metrics: bench/allreduce_bench.hpp
///   train_digits_examples_per_s_tcp, _shm  sync 2-worker digits MLP against one
///                               process, with held-out accuracies
///   train_digits_shm_vs_tcp     the digits job on shared memory against TCP
///   train_sync_partitioned_3ps  sync steps/s of a 3 M-float softmax cut into 3
///                               pieces over 3 ps processes, against the same
///                               model whole on 1 ps process (shared memory)
///   train_sync_1m_3w_1slow_tcp  the sync 1 M job with a straggler among 3
///                               workers (backup workers) against 2 workers
///
/// The 1 M lines time a window: warmup seconds after both workers' first
/// step, then window seconds (actorflow-train's warmup_secs and window_secs;
/// the raw ps measures the same).
///
/// The helper processes (raw ps, raw workers, all-reduce ranks) are this
/// binary re-executed with a hidden first argument, so they start clean
/// whatever threads the bench has by then.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace af::bench {

/// The training metrics, in the order they run.
const std::vector<std::string>& train_metrics();

struct train_bench_options {
  int reps = 3;                        ///< repetitions of each side (median)
  double warmup_s = 5;                 ///< the 1 M lines: seconds after both workers started
  double window_s = 15;                ///< the 1 M lines: the timed window, in seconds
  uint64_t steps_1m = 200;             ///< sync steps of train_sync_partitioned_3ps
  uint64_t digits_steps = 6000;        ///< sync steps of the digits MLP (x 64 examples)
  int allreduce_rounds = 50;           ///< timed all-reduces per repetition (after 5 warm-ups)
  std::chrono::seconds timeout{180};   ///< per cluster run; then its processes are killed
  std::vector<std::string> extra_sets; ///< more `--set key=value` for every actorflow-train run
  std::filesystem::path bin_dir;       ///< where actorflow-train is
  /// Each task serves /metrics (--metrics-port), scraped every scrape_ms
  /// while the job runs (bench/metrics_benches.cpp: the cost of watching).
  bool metrics = false;
  int scrape_ms = 1000;
};

/// `key=value` of the [train] table of the 1 M workload (config/linear_1m.toml's)
/// in `mode`, timed as the options say.
std::vector<std::string> linear_keys(const std::string& mode, const train_bench_options& o);

/// Runs the metrics of `wanted` that are training metrics, one line each, or
/// `metric NAME skipped: <why>` when ours cannot run (the baseline's figure
/// then follows as a `#` line).
void run_train_benches(const std::vector<std::string>& wanted, const train_bench_options& opts);

/// The hidden first argument that makes this binary one of the helpers.
constexpr const char* helper_flag = "--bench-role";

/// If argv[1] is helper_flag, runs that helper and returns its exit status;
/// otherwise -1. (The soak is its own program, actorflow-soak.)
int run_helper(int argc, char** argv);

} // namespace af::bench
