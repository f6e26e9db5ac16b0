#pragma once
/// A data-parallel training job (docs/training.md): what one worker task of a
/// between-graph job does, from a session of that task.
///
///   1. loads the data and builds the model's parameters (train/);
///   2. sync / async / average: creates the variables on the ps tasks (round
///      robin, as TF's replica_device_setter; with max_partitions > 1, pieces
///      of them spread by size, train/partition.hpp) and gets the aggregator
///      of each ps over its pieces (the same spec from every worker: one
///      actor per ps);
///   3. the chief (task 0) restores the latest checkpoint or initializes the
///      variables, or takes the job as it runs on ps tasks that hold it
///      already (a chief that died and came back: dist/chief_start.hpp);
///      the others wait for that with a bounded wait naming what is missing
///      (a chief that fails first says why, and they stop at once);
///   4. builds its replica of the step on its own device and spawns the worker
///      actor (dist/worker.hpp), which trains;
///   5. the chief waits for the other workers to finish, saves (sync, async:
///      the aggregators' state once every worker is done, pieces assembled
///      into the logical variables), and shuts the ps
///      tasks down (TF's ps never did).
/// The chief publishes where the job starts (global step, data position) in
/// its key-value store; the other workers resume their data from there.
/// allreduce: no ps; the workers meet through the chief's key-value store and
/// all-reduce their gradients.

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "dist/chief_start.hpp"
#include "actors/session.hpp"
#include "dist/worker.hpp"
#include "train/config.hpp"

namespace af {

struct train_options {
  bool shutdown_ps = true;  ///< the chief stops the ps tasks at the end
  bool print = true;        ///< progress lines on stdout (chief)
  /// Test hook, passed to the worker (worker_setup::tamper).
  std::function<void(uint64_t, std::vector<tensor>&)> tamper;
  /// Test hook, passed to the worker (worker_setup::before_push).
  std::function<void(size_t, uint64_t)> before_push;
  /// This worker joins a running job (actorflow-train --join): it is not
  /// one the job started with, so it looks the aggregators up as they run
  /// instead of making them, and they count it as a member from its join.
  bool join = false;
  /// A straggler on purpose (tests, benches): worker_setup::step_delay.
  std::chrono::milliseconds step_delay{0};
  /// Set to stop the job before its last step (worker_setup::stop).
  std::shared_ptr<const std::atomic<bool>> stop;
  /// Called with every progress report (after printing).
  std::function<void(const worker_progress&)> on_progress;
  /// Out, the chief of a job with ps tasks: what it found on them, set as
  /// soon as it knows (start_job_on_ps), so also when it fails after that.
  /// A chief that fails stops the ps tasks only when it started the job
  /// itself (ps_found::new_job): a job that ran before this chief came
  /// (running), or one it did not get to look at (unknown), is not its to
  /// end (programs/train_main.cpp).
  std::shared_ptr<std::atomic<ps_found>> found;
};

struct train_outcome {
  worker_result result;
  aggregator_stats stats;   ///< of ps 0's aggregator at the end (chief)
  std::string checkpoint;   ///< the last one written (chief)
  std::string plot;         ///< what became of the plot (chief)
  uint64_t start_step = 0;  ///< the global step it started at (restored)
  uint64_t start_position = 0; ///< the data position it started at (worker_setup)
  /// window_secs > 0, the chief: ps 0's global steps in the timed window and
  /// its length (0: the job ended before the window did).
  uint64_t window_steps = 0;
  double window_seconds = 0;
  /// Why a window that ran to its end is no measurement (window_seconds 0):
  /// the workers or the mode changed during it (timed_window.hpp).
  std::string window_not_measured;
};

/// The chief's progress line: "step S/T ..." where S counts toward the job's
/// T (worker_progress::step; average and allreduce say they are each
/// replica's local steps, average how many averaging rounds), then the loss,
/// held-out accuracy when evaluated, examples/s, async's staleness (median,
/// max, the histogram's non-empty buckets as s:count) and the time left
/// (from `start`, the step the job started at). A timed run (window_secs)
/// runs to its window's end, not to `total`: its line ends with
/// `timed_left` instead ("  window 12 s left"; empty: nothing).
std::string progress_line(const train::train_config& c, uint64_t total, uint64_t start,
                          const worker_progress& p, const std::string& timed_left = {});

/// What `actorflow-train --status` prints for one ps's aggregator (`where`
/// names it): the mode, the global step, and a row per worker: examples/s,
/// pushes, applied, late (dropped), refused, stale, time waiting, idle time;
/// then the membership and mode events.
std::string status_report(const std::string& where, const aggregator_stats& s);

/// Runs worker `task` of `workers` (the cluster's worker job) of the job `c`
/// through `s`, a session of that task. Returns when this worker is done.
caf::expected<train_outcome> run_worker_task(session& s, const train::train_config& c,
                                             uint32_t task, const train_options& opts = {});

/// In-graph replication: this one client (`s`) builds a replica of the step
/// on every worker task's device, averages their gradients in the graph, and
/// pushes the mean to a sync aggregator of each ps with one worker (itself).
/// Each replica is fed its own shard of every global batch, so the result
/// equals sync between-graph training with as many workers. The nodes are
/// plain actorflow-node (or actorflow-train --job) processes; with
/// opts.shutdown_ps the client stops the ps tasks at the end. opts.stop
/// ends the loop before its next step (the outcome then says how far it
/// got); opts.on_progress gets each log_every report (a tower's figures).
caf::expected<train_outcome> run_in_graph(session& s, const train::train_config& c,
                                          const train_options& opts = {});

} // namespace af
