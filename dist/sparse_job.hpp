#pragma once
/// A sparse training job (issue 25, docs/sparse.md "The sparse job"): a
/// model over embedding tables (train/sparse_model.hpp; model =
/// "recommender") trained between-graph by the cluster's workers, its tables
/// cut over the ps tasks and no process holding a whole one.
///
/// What one worker task does, from a session of that task:
///   1. loads the job's click data and makes the model (train/local.hpp);
///   2. declares each table's shards, shard k on /job:ps/task:k
///      (<table>/part_<k>, cut by partition_strategy), and the dense
///      parameters on ps 0; each shard's initializer names its global rows,
///      so its node computes them (graph/embedding.hpp's shard_initializer);
///   3. the chief initializes them, or with a checkpoint in checkpoint_dir
///      restores it (dist/sparse_checkpoint.hpp: each ps its shards, any
///      old layout; every aggregator at its global step); the others wait
///      for that (bounded by init_timeout_ms, naming what is missing);
///   4. gets the aggregator of each ps over its shards (sparse) and, on ps 0,
///      the dense parameters, in the job's mode (sync, async or ssp: average
///      and allreduce cannot take sparse gradients and are refused here),
///      and joins it;
///   5. each step: its share of the global batch, each table's ids made
///      unique and routed, the rows read from their shards, the model's step
///      on them, each shard sent its rows' gradients (dist/sparse_step.hpp);
///      it ends when the global step reaches the job's steps; the chief
///      checkpoints every checkpoint_steps / checkpoint_secs;
///   A ps that dies meanwhile is waited for (ps_recovery_timeout_ms) and,
///   once it runs again, its shards restored by the chief from the latest
///   checkpoint (dist/sparse_recovery.hpp, dist/ps_recovery.hpp);
///   6. says done; the chief then waits for the other workers to be done
///      (bounded), checkpoints, scores the held-out set (AUC, log-loss)
///      and, with shutdown_ps, stops the ps tasks.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "caf/expected.hpp"

#include "actors/session.hpp"
#include "train/config.hpp"

namespace af {

/// A test build's pause in a sparse task's set-up (actorflow-train-pausing,
/// tests/checkpoint_pause_hook.cpp): called with the worker task and its
/// set-up pass (1 first; more after a ps that died during it came back)
/// once the tables are initialized or waited for, before any aggregator is
/// joined. The library installs none and reads no switch of its own.
using sparse_set_up_hook = void (*)(uint32_t task, uint32_t pass);
void set_sparse_set_up_hook(sparse_set_up_hook hook);

struct sparse_job_options {
  bool shutdown_ps = true; ///< the chief stops the ps tasks at the end
  bool print = true;       ///< the chief's progress lines on stdout
  /// This worker (not the chief) joins a running job (--join): its config
  /// lists more workers than the job started with; it takes the job's
  /// aggregators as they run and the chief's count of steps.
  bool join = false;
  /// A straggler on purpose (tests: --step-delay-ms): each step starts this much later
  /// (in-graph: each replica's step).
  std::chrono::milliseconds step_delay{0};
  /// The chief's (the in-graph client's) log_every reports, beside its
  /// progress line: the global step, its own steps, seconds since its
  /// first step, the mean loss since the last report (af.train.Job's records).
  std::function<void(uint64_t global_step, uint64_t local_steps, double seconds, double loss)>
    on_progress;
  /// Set to end the training loop before its next step (af.train.Job's
  /// stop): a worker then says done as at the end (a sync round goes on
  /// without it), and the chief (the in-graph client) waits for the
  /// others, checkpoints and scores as at the end.
  std::shared_ptr<const std::atomic<bool>> stop;
};

/// What a worker of a sparse job reports.
struct sparse_outcome {
  uint64_t global_step = 0;  ///< the aggregators' at its last push
  uint64_t local_steps = 0;  ///< steps this worker ran
  uint64_t late = 0;         ///< sync: its pushes dropped as late
  double seconds = 0;        ///< its training loop
  double last_loss = 0;      ///< mean training loss of its last log_every steps (or its last)
  /// Payload bytes this worker's steps moved, per step: ids out and rows
  /// back (fetch), ids and gradients out (push), counted at the data plane's
  /// calls; and the touched rows' bytes plus their ids (one copy each way),
  /// what an ideal exchange moves.
  double bytes_per_step = 0;
  double touched_bytes_per_step = 0;
  /// The chief: held-out AUC and log-loss (NaN for the others), and on
  /// synthetic data the planted truth's own.
  double auc = 0;
  double log_loss = 0;
  bool has_truth = false;
  double truth_auc = 0;
  double truth_log_loss = 0;
  size_t train_examples = 0;
  size_t test_examples = 0;
  /// The chief: the workers that finished the job (one that died is not
  /// counted); the others: the job's.
  uint32_t workers = 0;
  uint64_t ps_recoveries = 0; ///< ps processes this worker waited for and went on with
};

/// The aggregator of ps k of a sparse job is "<sparse_aggregator_prefix><k>"
/// for the job's life (--status looks them up by it: dist/train_client.hpp).
inline constexpr const char sparse_aggregator_prefix[] = "train/sparse/ps";

/// The key under which a sparse job's chief says, in its key-value store,
/// how the job runs ("between-graph", or "in-graph": one client, its
/// replicas taking turns on one thread), so that a live switch
/// (dist/train_client.hpp's job_switch) can refuse what the job cannot do.
std::string sparse_client_key(uint64_t chief_incarnation);

/// True if `c` is a sparse job (its model is one of train/sparse_model.hpp's).
bool sparse_job(const train::train_config& c);

/// Runs worker `task` of a sparse job `c` through `s`, a session of that
/// task, and returns when this worker is done (the chief: once every worker
/// is, with the held-out scores).
caf::expected<sparse_outcome> run_sparse_worker_task(session& s, const train::train_config& c,
                                                     uint32_t task,
                                                     const sparse_job_options& o = {});

} // namespace af
