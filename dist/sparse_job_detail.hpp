#pragma once
/// The pieces of a sparse job's worker (dist/sparse_job.cpp) that the
/// in-graph client (dist/sparse_in_graph.cpp) drives too: a task's state,
/// its set-up (the tables declared, initialized or restored, the
/// aggregators joined), its checkpoints, its done and the held-out scores.
/// Internal to dist/: programs use dist/sparse_job.hpp and
/// dist/sparse_in_graph.hpp.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "caf/scoped_actor.hpp"

#include "actors/session.hpp"
#include "dist/sparse_checkpoint.hpp"
#include "dist/sparse_job.hpp"
#include "dist/sparse_metrics.hpp"
#include "dist/sparse_recovery.hpp"
#include "dist/sparse_step.hpp"
#include "dist/worker_loop.hpp"
#include "messages/aggregator.hpp"
#include "train/local.hpp"
#include "train/recommender.hpp"

namespace af::sparse_job_detail {

/// The aggregator of ps k of a sparse job (one name per ps for the job's life).
inline std::string aggregator_name(size_t k) {
  return sparse_aggregator_prefix + std::to_string(k);
}

/// This worker's membership at one ps's aggregator.
struct ps_member {
  aggregator_actor actor;
  std::string token;
};

/// Everything a worker of the job holds once it is set up.
struct sparse_task {
  sparse_task(session& session_of_task, const train::train_config& config)
    : s(session_of_task), c(config) {}
  session& s;
  const train::train_config& c;
  uint32_t task = 0;
  uint32_t workers = 0;
  bool chief = false;
  bool join = false;   ///< joins a running job (sparse_job_options::join)
  /// The in-graph client (dist/sparse_in_graph.hpp): the chief says so in
  /// its key-value store, and a live switch of the job is refused.
  bool in_graph = false;
  uint64_t total = 0;  ///< the job's steps (the chief's count: set_up)
  /// 1 on the first set-up, one more each time it runs again after a ps
  /// that died during it came back (set_up_with_recovery).
  uint32_t set_up_pass = 0;
  /// Set once a set-up pass first asks a ps for something (declare): an
  /// error before it (the data, the model, the config) is no ps's doing,
  /// and set_up_with_recovery returns it without waiting for any ps.
  bool asked_ps = false;
  std::chrono::milliseconds timeout{0};
  train::click_data data;
  std::unique_ptr<train::recommender> model;
  std::vector<output> vars;
  std::vector<std::vector<output>> ps_vars; ///< per ps: its variables (a recovery re-creates them)
  sparse_layout layout;
  std::vector<ps_member> members;                     ///< per ps
  std::vector<std::unique_ptr<data_plane_ps_link>> links; ///< per ps
  std::vector<sparse_ps_link*> link_ptrs;
  /// Per ps as joined: its node and aggregator (a recovery's starting point).
  std::vector<param_shard> shards;
  /// With ps_recovery_timeout_ms: the links above wrapped, so that a ps
  /// that dies is waited for and its shards restored (sparse_recovery.hpp).
  std::shared_ptr<training_detail::recovery_context> recovery;
  std::unique_ptr<sparse_recovery> recovering;
  std::vector<std::unique_ptr<recovering_ps_link>> wrapped;
  /// The aggregators' global step when this worker joined (the least of
  /// them): 0, or the step of the checkpoint the chief restored.
  uint64_t start_step = 0;
  /// Per ps: its global step when this worker joined, then as its last
  /// push's answer left it (each ps's push carries its own step).
  std::vector<uint64_t> ps_steps;
  /// Where this worker's data resumes (data_cursor::next at the start): the
  /// restored checkpoint's data_position (the chief's, told the others in
  /// its key-value store), or for a worker that joins a running job the
  /// job's step's share.
  uint64_t start_position = 0;
  /// The live switches the aggregators told this worker of (rejoin) and
  /// where its data stream is (its checkpoints' data_position).
  switch_notice switches;
  data_cursor cursor;
  sparse_checkpoint_job checkpoints;  ///< what a checkpoint of the job holds
  uint64_t last_saved = 0;            ///< the chief: the step of its last checkpoint
  bool saved_any = false;
  /// Keeps this worker a member: every aggregator monitors it (a worker
  /// that goes away stops being waited for).
  std::unique_ptr<caf::scoped_actor> self;
  /// The chief, with metrics set: the metrics CSV and the per-worker rows.
  std::unique_ptr<sparse_metrics> metrics;
};

/// mode must be sync, async or ssp: invalid_argument naming it otherwise.
caf::error refuse_mode(const train::train_config& c);

/// The aggregator spec of ps k for `t` (t.workers members).
aggregator_spec spec_of(const sparse_task& t, uint32_t k);

/// Joins ps k's aggregator as worker t.task (a membership, its token and
/// its link); t.layout must be set.
caf::error join_ps(sparse_task& t, uint32_t k);

/// What an aggregator answers a join: its global step, the worker's token
/// and the number of the last push it took from it.
struct joined {
  uint64_t global_step = 0;
  std::string token;
  uint64_t last_seq = 0;
};

/// Joins `agg`, ps k's aggregator, as this worker (`t.self` the member it
/// monitors). From a step's thread too (a recovery): a scoped actor of its
/// own asks. (dist/sparse_members.cpp)
caf::expected<joined> join_aggregator(sparse_task& t, uint32_t k, const aggregator_actor& agg);

/// The live switches the aggregators told this worker's member actor
/// (t.self) of since its last step (switch, aggregator, mode, step: read
/// without waiting), noted in t.switches and t.cursor; into sync, every ps is
/// joined again before the next push, as the dense worker does
/// (dist/worker_exchange.cpp's exchange). With recovery, a ps that cannot
/// be joined is left to the step's recovery; without, its error.
caf::error take_switches(sparse_task& t);

/// Steps 1 to 4 of the task (dist/sparse_job.hpp): the data and model, the
/// tables declared, initialized or restored (t.chief) or waited for, every
/// aggregator joined, the layout agreed on with the chief.
caf::error set_up(sparse_task& t);

/// set_up, and with ps_recovery_timeout_ms, again while a ps went away
/// during it (its ping fails, or a new process answers): that ps waited
/// for (ps_recovery_timeout_ms), the set-up's state dropped (the member
/// actor kept), the set-up run again; the chief then says in its key-value
/// store that it restored each ps that came back (restored_key), for the
/// workers already waiting in their own ps recovery. Any other failure, or
/// none of the ps gone, is set_up's error. (dist/sparse_set_up.cpp)
caf::error set_up_with_recovery(sparse_task& t);

/// The test hook (set_sparse_set_up_hook), if any, for `t` at its set-up
/// pass: once the tables are initialized or waited for, before the joins.
void run_set_up_hook(const sparse_task& t);

/// `t`'s links (its joins done) wrapped in recovering_ps_links over a
/// sparse_recovery of its own (t.recovering): `recover` waits for a ps that
/// died, and a new aggregator is joined as worker t.task; `find` looks up
/// an aggregator anew for a join again after a refusal as left. set_up
/// does it with the job's ps recovery (ps_recovery_timeout_ms > 0); the
/// in-graph client for each replica's membership, through its own.
caf::error wrap_links(sparse_task& t, sparse_recovery::recover_fn recover,
                      sparse_recovery::find_fn find);

/// Examples `picks` of `b` as a batch of their own.
void take(const train::sparse_batch& b, const std::vector<size_t>& picks,
          train::sparse_batch& out);

/// The chief, with metrics set: opens them (sparse_metrics::open) for
/// `workers` workers at t.start_step.
caf::error open_metrics(sparse_task& t, uint32_t workers);

/// The chief's report to its metrics, if any, at global step `global`:
/// `local_steps` of batch_size examples in `seconds`, `loss` their mean.
void report_metrics(sparse_task& t, uint64_t global, uint64_t local_steps, double seconds,
                    double loss);

/// After the training loop: each ps's aggregator and this worker's token
/// there as they are now (a recovered ps has a new one), for done, the
/// stats and the last checkpoint.
void take_recovered(sparse_task& t);

/// The held-out set scored with the tables as they are now (out.auc, out.log_loss).
caf::error score(sparse_task& t, sparse_outcome& out);

/// The bytes every link of `t` sent and received so far.
uint64_t link_bytes(const sparse_task& t);

/// The chief's checkpoint at global step `global` (once per step).
caf::error checkpoint(sparse_task& t, uint64_t global, uint64_t data_position, bool print);

/// This worker is done at every aggregator (`why`: empty if it finished,
/// else why it failed).
caf::error say_done(sparse_task& t, const std::string& why);

} // namespace af::sparse_job_detail
