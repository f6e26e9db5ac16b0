#pragma once
// What a node's /metrics costs (bench/metrics_benches.cpp): on against off.
#include <string>
#include <vector>

#include "bench/bench_train.hpp"
#include "bench/benches.hpp"

namespace af::bench {

/// metrics_remote_assign_add_rtt, metrics_train_sync_1m_2w_tcp.
const std::vector<std::string>& metrics_cost_metrics();

/// Runs those of them `wanted` names, one line each: the round trip with
/// `rounds` per side and `reps` repetitions, the training line with
/// topts.reps runs per side.
int run_metrics_benches(const wanted_fn& wanted, int rounds, int reps,
                        const train_bench_options& topts);

} // namespace af::bench
