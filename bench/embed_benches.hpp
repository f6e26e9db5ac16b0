#pragma once
/// The sparse lines of actorflow-bench (issue 25, section 5; docs/sparse.md),
/// each against a hand-written raw-TCP baseline in the same run
/// (embed_raw.hpp), alternating so that both sample the same stretch of time:
///
///   embed_lookup_512_3ps_tcp   a 512-id lookup into a 1,000,000 x 64 float32
///                              table cut by mod over 3 ps processes
///                              (actorflow-node, ACTORFLOW_DATA_SHM=off), run
///                              by a session on a worker node in this process
///                              (the lookup subgraph of graph/embedding.hpp):
///                              median and p99 latency in us (lower is better),
///                              the bytes at the ps sockets per lookup, and the
///                              ps processes' VmRSS
///   train_embed_10m_2w         sync and async steps/s of a 10,000,000 x 64
///                              table over 3 shards with 2 workers of 512
///                              uniform ids: actorflow-train's sparse job (3 ps
///                              + 2 worker processes, TCP) against the raw ps;
///                              bytes per worker step at the sockets, VmRSS

#include <string>
#include <vector>

#include "bench/benches.hpp"

namespace af::bench {

/// The sparse metrics, in the order they run.
const std::vector<std::string>& embed_metrics();

/// Runs the wanted sparse metrics, one line (or a few) each; 0, or 1 after
/// saying why on stderr.
int run_embed_benches(const wanted_fn& wanted);

/// If argv[1] is helper_flag and argv[2] one of the sparse lines' helpers,
/// runs it and returns its exit status; otherwise -1.
int run_embed_helper(int argc, char** argv);

namespace embed_detail {
/// embed_lookup_512_3ps_tcp (embed_lookup.cpp).
int lookup_bench();
/// train_embed_10m_2w (embed_train.cpp).
int train_bench();
} // namespace embed_detail

} // namespace af::bench
