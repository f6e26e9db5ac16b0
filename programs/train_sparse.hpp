#pragma once
// actorflow-train's sparse jobs (model = "recommender", issue 25): in one
// process (--local), on an embedded cluster (the default without --job),
// in-graph on one (--in-graph), and the lines a worker of such a job
// prints. The between-graph tasks themselves (--job worker --task I) go
// through train_main's run_worker, which calls af::run_sparse_worker_task
// for such a config (af::run_sparse_in_graph for --in-graph on task 0).

#include <cstdint>
#include <string>

#include "dist/sparse_job.hpp"
#include "train/config.hpp"

namespace af::programs {

/// How train_main says why it stops: prints `msg` once and returns `code`.
using fail_fn = int (*)(const std::string& msg, int code);

/// --local: the one-process sparse trainer (train/local.hpp), printing the
/// held-out AUC and log-loss (and the planted truth's).
int run_sparse_local(const train::train_config& c, fail_fn fail);

/// The default (no --job): an embedded cluster of `ps` ps and `workers`
/// workers in this process.
int run_sparse_embedded(const train::train_config& c, int ps, int workers, fail_fn fail);

/// --in-graph without --job: an embedded cluster of `ps` ps and `workers`
/// workers, and one client (on worker 0's node) driving a replica per
/// worker (dist/sparse_in_graph.hpp).
int run_sparse_in_graph_embedded(const train::train_config& c, int ps, int workers,
                                 fail_fn fail);

/// The chief's closing lines: held-out scores (beside the planted truth's),
/// bytes per step against the touched rows', and the train-done line.
void print_sparse_summary(const train::train_config& c, uint32_t workers, const sparse_outcome& o);

} // namespace af::programs
