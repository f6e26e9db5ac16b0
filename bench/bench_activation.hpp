#pragma once
/// The model-parallel activation benchmark of actorflow-bench (issue 12,
/// part 2): two actorflow-node processes on this host, a graph whose
/// partition on task 0 makes a 64 MiB float32 value each step and whose
/// partition on task 1 consumes it. The figure is the edge's transfer as the
/// trace has it (sent by task 0's executor to taken by task 1's; both
/// processes read this host's CLOCK_MONOTONIC), against the raw TCP
/// buffer-to-buffer transfer of 64 MiB measured in alternation:
///
///   model_parallel_64mib_activation        the data plane over TCP (nodes with ACTORFLOW_DATA_SHM=off)
///   model_parallel_64mib_activation_local  the data plane over shared memory
///   model_parallel_64mib_activation_caf    the old path (a CAF message), for the record

#include <functional>
#include <string>

namespace af::bench {

/// Prints one `metric` line per figure; `b2b_mbps()` runs one raw TCP
/// buffer-to-buffer transfer of 64 MiB and gives its MB/s. Non-zero: failed.
int run_activation_bench(int reps, const std::function<double()>& b2b_mbps);

} // namespace af::bench
