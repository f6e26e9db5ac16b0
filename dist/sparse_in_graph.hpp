#pragma once
/// In-graph replication of a sparse job (issue 25, docs/sparse.md
/// "In-graph"): one client drives a replica of the model per worker task
/// of the cluster against the job's ps tasks, each replica fed its own
/// share of every global batch, as the dense in-graph client does
/// (dist/training.hpp's run_in_graph).
///
/// A replica's step is the between-graph worker's (dist/sparse_step.hpp:
/// its ids made unique and routed, its rows read from their shards, the
/// model's step on them); the replicas run one after another in the
/// client's process (a sparse model's step is code on the rows a step
/// read, not graph ops placed on a device). What differs is the push:
///   - sync: the client is the one member of each ps's aggregator; the
///     replicas' pushes of a step are merged (each replica's rows times
///     1 / replicas, a repeated id's summed in replica order; the dense
///     gradients' mean) and sent as one push per ps, applied once. With
///     two replicas this is bit for bit what a sync round of two
///     between-graph workers applies.
///   - async, ssp: the client joins each aggregator once per replica (as
///     worker r) and every replica pushes its own step at once.
/// The client is the chief: it initializes or restores the tables,
/// checkpoints (checkpoint_dir), scores the held-out set and, with
/// shutdown_ps, stops the ps tasks.

#include "caf/expected.hpp"

#include "actors/session.hpp"
#include "dist/sparse_job.hpp"
#include "train/config.hpp"

namespace af {

/// Runs the sparse job `c` in-graph through `s` (a session on the job's
/// cluster, as its chief /job:worker/task:0): a replica per worker task.
/// The outcome's local_steps count the client's steps (sync) or every
/// replica's pushes (async, ssp).
caf::expected<sparse_outcome> run_sparse_in_graph(session& s, const train::train_config& c,
                                                  const sparse_job_options& o = {});

} // namespace af
