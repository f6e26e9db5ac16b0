#pragma once
/// The all-reduce metrics of actorflow-bench (listed among the training
/// metrics, bench_train.hpp): our ring (dist/allreduce.hpp) between 2 rank
/// processes on this host against a hand-written exchange of the same bytes.
///
///   allreduce_4mib_2w           MB/s of one 4 MiB all-reduce between 2 ranks
///
/// The ranks are this binary re-executed with helper_flag (bench_train.hpp).

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
