#pragma once
// actorflow-bench's groups of metrics, each in its own file; main_body
// (bench_main.cpp) runs the groups that have a wanted metric.
#include <functional>
#include <string>

#include "config/cluster_spec.hpp"

namespace af::bench {

/// Whether the metric of this name is to run.
using wanted_fn = std::function<bool(const std::string&)>;

/// The metrics of one ps node against a raw peer, and of local actors: each
/// wanted one prints its line. Forks the raw peer first: call it before any
/// thread exists. (core_benches.cpp)
int core_benches(const wanted_fn& wanted, af::node_options opts, const std::string& transport,
                 int rounds, int reps, int poll_us);

/// The data plane with and without TLS, and the event-loop prototype; leaves
/// no thread behind. (tls_benches.cpp)
int tls_benches(const wanted_fn& wanted, int rounds, int reps, int poll_us);

/// The data plane over shared memory (and UCX) against TCP and the raw peer.
/// (shm_benches.cpp)
int shm_benches(const wanted_fn& wanted, int rounds, int reps, int poll_us);

/// MSG_ZEROCOPY (tcp_4mib_send_zerocopy) and vmsplice + splice
/// (tcp_4mib_send_splice) against plain send() of 4 MiB messages over
/// loopback TCP, alternating `reps` times (loopback_send_probe.cpp).
int send_probe_bench(const wanted_fn& wanted, int reps);

/// 4 MiB memcpys walking a working set larger than the last-level cache
/// against the same copies in cache (memcpy_4mib_working_set), `reps` (at
/// least 5) times alternating (memory_probe.cpp).
int memory_probe_bench(const wanted_fn& wanted, int reps);

} // namespace af::bench
