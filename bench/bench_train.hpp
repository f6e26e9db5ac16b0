#pragma once
/// The training benchmarks of actorflow-bench (issue 8). Each measures
/// actorflow-train's processes (1 ps + 2 workers on loopback) or the
/// all-reduce group against hand-written raw-TCP code in processes of the
/// same shape, alternating repetitions so that both sample the same stretch
/// of time, and prints `metric NAME ours=X baseline=Y unit=U ratio=Z`:
///
///   train_sync_1m_2w            sync steps/s, linear regression of 1 M floats
///   train_async_1m_2w           async global steps/s, the same model
///   allreduce_4mib_2w_*         all-reduce metrics: bench/allreduce_bench.hpp
///   train_digits_examples_per_s sync 2-worker digits MLP against one process
///   train_sync_partitioned_3ps  sync steps/s of a 3 M-float softmax cut into 3
///                               pieces over 3 ps processes, against the same
///                               model whole on 1 ps process
///   train_sync_1m_2w_shm_vs_tcp train_sync_1m_2w's job with the data plane on
///                               shared memory (the default on one host)
///                               against the same job over loopback TCP
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
  uint64_t steps_1m = 200;             ///< sync steps of the 1 M-float model (async: 2x, global)
  uint64_t warmup_1m = 20;             ///< raw workers' steps before the clock starts
  uint64_t digits_steps = 6000;        ///< sync steps of the digits MLP (x 64 examples)
  int allreduce_rounds = 50;           ///< timed all-reduces per repetition (after 5 warm-ups)
  std::chrono::seconds timeout{180};   ///< per cluster run; then its processes are killed
  std::vector<std::string> extra_sets; ///< more `--set key=value` for every actorflow-train run
  std::filesystem::path bin_dir;       ///< where actorflow-train is
};

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
