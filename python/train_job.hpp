#pragma once
/// af.train.Job's runner (python/train_job_run.cpp): the cluster of a job
/// in this process and its tasks' threads, as actorflow-train runs one on
/// an embedded cluster (programs/train_main.cpp's run_embedded and
/// run_in_graph_embedded, programs/train_sparse.cpp's run_sparse_embedded
/// and run_sparse_in_graph_embedded): dense or sparse, between-graph or
/// in-graph, through the same dist/ calls. python/train_job.cpp is the
/// Python side that starts, watches and ends it.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "caf/error.hpp"
#include "caf/expected.hpp"

#include "dist/embedded_cluster.hpp"
#include "dist/sparse_in_graph.hpp"
#include "dist/sparse_job.hpp"
#include "dist/training.hpp"
#include "train/config.hpp"

namespace af::python {

/// One switch or status call of a Python thread on a running job: run in a
/// thread of its own (start_client_call) while the caller waits for it in
/// slices of 50 ms, the GIL released, so that Ctrl-C interrupts the wait;
/// an interrupted call ends on its own (bounded by its session's timeout)
/// and its answer is dropped.
struct client_call {
  std::mutex mutex; ///< guards what follows
  std::condition_variable answered;
  bool done = false;
  bool no_cluster = false; ///< the job was not running: no session was made
  /// The caller was interrupted: a call that has not asked the cluster
  /// yet does not (one that has may still take effect, as an RPC would).
  bool cancelled = false;
  caf::expected<std::string> text{std::string{}};
};

/// What a call does with a session of ps 0's node (it may not touch the
/// caller's stack: the caller may be gone, interrupted).
using client_use = std::function<caf::expected<std::string>(caf::expected<session>&)>;

struct job_run;

/// Starts `use` in a client thread of `j` (joined by stop_and_join).
std::shared_ptr<client_call> start_client_call(const std::shared_ptr<job_run>& j, client_use use);

/// What a job's threads share with Python: the reports not taken yet, how
/// the workers ended, and the cluster while it runs (for switch, status).
struct job_run {
  train::train_config c;
  int workers = 2;
  int ps = 1;
  bool verbose = false;
  /// In-graph replication (actorflow-train --in-graph): one client, on
  /// worker 0's node, drives a replica per worker; results has its outcome.
  bool in_graph = false;
  bool sparse = false; ///< a sparse job (dist/sparse_job.hpp): sparse_results, not results
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);
  std::mutex mutex; ///< guards what follows, up to cluster_mutex
  std::condition_variable changed;
  std::deque<worker_progress> records;
  bool finished = false; ///< every thread of the job has ended, the cluster too
  caf::error start_error;
  std::vector<caf::expected<train_outcome>> results;
  std::vector<caf::expected<sparse_outcome>> sparse_results;
  /// Held while a client (switch, status) uses the cluster, and by the
  /// runner when it stops the cluster.
  std::mutex cluster_mutex;
  std::unique_ptr<embedded_cluster> cluster;
  std::string memory_name; ///< the registered data set ("": none)
  std::thread runner;
  /// Held while a Python thread joins the runner: two threads' joins of one
  /// std::thread (__exit__ from two threads) are undefined, and hung.
  std::mutex join_mutex;
  /// Test hook (af.train.Job._hold_clients): while set (under `mutex`), a
  /// client call waits before it asks the cluster, as one to a ps that does
  /// not answer would; the runner's end lets it go on.
  bool hold_clients = false;
  std::mutex clients_mutex; ///< guards clients
  std::vector<std::pair<std::thread, std::shared_ptr<client_call>>> clients;
};

/// Stops the job and waits for its runner and its client calls (the caller
/// has released the GIL).
void stop_and_join(job_run& j);

/// Keeps `j` so that the interpreter's exit stops and joins it (stop_every_job).
void remember_started(const std::shared_ptr<job_run>& j);

/// atexit's: every job still held somewhere, stopped and joined.
void stop_every_job();

/// The runner thread: the cluster, the job's threads, then the cluster's end.
void run_job(job_run& j);

} // namespace af::python
