#pragma once
/// The all-reduce metrics of actorflow-bench (listed among the training
/// metrics, bench_train.hpp): our ring (dist/allreduce.hpp) between 2 rank
/// processes on this host against a hand-written exchange of the same bytes
/// on the same transport:
///
///   allreduce_4mib_2w_tcp  MB/s of one 4 MiB all-reduce (mean) between 2
///                          ranks, our ring with ACTORFLOW_DATA_SHM=off
///                          against the raw-TCP exchange (one socket)
///   allreduce_4mib_2w_shm  the same with our ring on shared memory against
///                          a raw shared-memory exchange (a pair of rings,
///                          the same wake-up rule)
///
/// Each repetition is one pair of processes that runs both sides, alternately,
/// round by round (--allreduce-rounds each, after 5 warm-ups), so that both
/// sample the same moments of a noisy machine; the figures are rank 0's
/// medians. A comment line gives each side's CPU time and context switches
/// per call (both ranks), steadier than the MB/s on a shared machine. The
/// ranks are this binary re-executed with helper_flag (bench_train.hpp;
/// bench/allreduce_helpers.cpp); ACTORFLOW_BENCH_AR_ONLY=ours or raw makes
/// them run one side only (no figures), for perf stat over the pair.

#include <string>
#include <vector>

#include "bench/bench_train.hpp"

namespace af::bench {

/// The all-reduce metrics, in the order they run.
const std::vector<std::string>& allreduce_metrics();

/// Runs the metrics of `wanted` that are all-reduce metrics, one line each
/// (`metric NAME skipped: <why>` when ours cannot run).
void run_allreduce_benches(const std::vector<std::string>& wanted, const train_bench_options& opts);

/// If argv[1] is helper_flag and argv[2] one of the all-reduce's roles, runs
/// that helper and returns its exit status; otherwise -1.
int run_allreduce_helper(int argc, char** argv);

} // namespace af::bench
