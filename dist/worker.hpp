#pragma once
/// The worker actor of data-parallel training: an event-based actor that owns
/// its data shard and its replica of the step (forward, loss, gradients, on
/// its own device through the asynchronous step runner), and loops:
///
///   sync / async   run step -> push gradients to each ps shard's aggregator
///                  -> the answer carries the next parameters -> run step ...
///   average        run `average_every` local steps on its own replica, then
///                  push its parameters; the answer is the average
///   allreduce      run step -> all-reduce the gradients with the other
///                  workers (no ps) -> apply the same update locally
///
/// The mode is in which aggregator (or collective) the gradients go to; the
/// loop is the same. Pushes go over the ps node's data plane, from a
/// detached link actor per shard, so the worker never blocks a scheduler
/// thread. The chief (worker 0) also evaluates on the held-out set and
/// writes checkpoints.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "caf/expected.hpp"

#include "dist/allreduce.hpp"
#include "actors/step_here.hpp"
#include "actors/step_runner.hpp"
#include "messages/aggregator.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/data.hpp"
#include "train/local.hpp"
#include "train/model.hpp"
#include "train/partition.hpp"

namespace af {

/// The variables of one ps node and the aggregator that owns them: pieces of
/// the model's parameters (train/partition.hpp), whole ones unless the job
/// partitions its variables.
struct param_shard {
  std::string task;              ///< "/job:ps/task:0", for messages
  std::string aggregator;        ///< its name on that node
  aggregator_actor actor;        ///< for done, save and restore (control)
  std::string host;              ///< its data plane (pushes and pulls)
  uint16_t data_port = 0;
  /// Its node's incarnation: a ps restarted after it died has another one.
  uint64_t incarnation = 0;
  /// Which rows of which parameter each of its variables holds, in the
  /// aggregator's push order: the worker cuts its pushes along these rows
  /// and assembles what it pulls from them.
  std::vector<train::piece> pieces;
};

/// What a worker reports as it trains (on its own thread).
struct worker_progress {
  uint32_t worker = 0;
  uint64_t local_step = 0;      ///< steps this worker ran in this process
  uint64_t global_step = 0;     ///< the aggregator's (average: local steps at the last round)
  /// What counts toward the job's total_steps: the global step (sync, async),
  /// every replica's own local steps since the job began (average, allreduce).
  uint64_t step = 0;
  uint64_t rounds = 0;          ///< average: averaging rounds of the job so far
  double loss = 0;              ///< mean training loss since the last report
  double accuracy = -1;         ///< held-out, when evaluated at this report
  double test_loss = -1;
  double examples_per_s = 0;    ///< this worker's, since it started
  double seconds = 0;           ///< since the first step
  aggregator_stats stats;       ///< of shard 0 (per worker, events; async, ssp: staleness)
  bool evaluated = false;
  bool final = false;
  /// The chief with logdir and histogram_every: its parameters at this
  /// report and the gradients of its last step (shared buffers, read before
  /// the next step runs), in worker_setup::params' order; empty otherwise.
  std::vector<tensor> values;
  std::vector<tensor> gradients;
};

struct worker_result {
  uint64_t local_steps = 0;
  uint64_t global_step = 0;
  double seconds = 0;           ///< first step to last
  double loss = 0;              ///< mean of the last report's window
  /// False: no progress report measured a loss (a timed run stopped before
  /// its first report, log_every = 0 for one); `loss` is then no figure.
  bool has_loss = true;
  double accuracy = -1;         ///< held-out at the end (chief)
  double test_loss = -1;
  uint64_t refused = 0;         ///< its steps it abstained from (non-finite)
  /// sync with backup workers: of local_steps, those it neither computed
  /// nor sent in full because their step had closed without it
  uint64_t skipped = 0;
  /// sync with backup workers: the parameters pulled without a push (the
  /// chief's after each skipped step; another worker's only before a step
  /// it computes after skipped ones, and once the job's last round closed)
  uint64_t pulls = 0;
  /// Of local_steps, those whose gradients it computed (a backup worker's
  /// skipped steps are not, but for one that closed while it computed)
  uint64_t computed = 0;
  /// Of local_steps, those run on the worker's own thread (actors/step_here.hpp)
  /// rather than sent to its executor.
  uint64_t steps_here = 0;
  std::string last_refusal;     ///< why, naming the worker, the variable and the element
  uint64_t checkpoint_failures = 0; ///< checkpoints it could not write (it trains on)
  std::string checkpoint_error; ///< the last one's reason
  std::vector<tensor> params;   ///< the parameters it ended with
  /// The shards as they ended: a ps that died and came back has a new
  /// aggregator (and maybe a new data port). Empty: allreduce.
  std::vector<param_shard> shards;
  uint64_t ps_recoveries = 0;   ///< ps tasks it waited for and went on with
};

/// What a worker that its client stopped (worker_setup::stop) had done, as
/// it stopped: it ends with af_error::cancelled, so its own counts come back
/// here (a timed window's end reports them: training.cpp, timed_end).
struct stopped_counts {
  bool set = false;             ///< it stopped through worker_setup::stop
  uint64_t local_steps = 0;
  uint64_t global_step = 0;
  uint64_t skipped = 0;         ///< worker_result::skipped
  uint64_t pulls = 0;           ///< worker_result::pulls
  uint64_t computed = 0;        ///< worker_result::computed
};

/// A ps task that came back after it died (worker_setup::recover_ps).
struct recovered_shard {
  param_shard shard;            ///< its new aggregator, node and data port
  uint64_t global_step = 0;     ///< the step its aggregator was restored at
};

struct worker_setup {
  uint32_t index = 0;
  uint32_t workers = 1;
  train::train_config cfg;
  std::shared_ptr<const train::split> data;
  std::shared_ptr<prepared_step> step;  ///< fetches: loss, then the gradients
  std::shared_ptr<prepared_step> eval;  ///< fetches: loss, correct (null: no evaluation)
  train::replica model;                 ///< the placeholders and fetches of both
  std::vector<train::parameter> params;
  std::vector<param_shard> shards;      ///< sync, async, average
  std::shared_ptr<allreduce_group> group; ///< allreduce
  std::vector<tensor> initial;          ///< allreduce: the first parameters
  /// allreduce, average: the slots the replica starts with (restored; empty: zeros)
  std::vector<std::vector<tensor>> initial_slots;
  uint64_t total_steps = 0;             ///< global steps (average, allreduce: local steps)
  uint64_t start_step = 0;              ///< the global step it starts at (restored)
  uint64_t start_position = 0;          ///< the data position it starts at (data_position)
  std::chrono::milliseconds timeout{30000};
  /// Chief only: called with the state to save (every checkpoint_steps; at the
  /// end only with its own replica, average and allreduce: sync and async save
  /// at the end after every worker is done, run_worker_task); returns where it
  /// went or an error.
  std::function<caf::expected<std::string>(const train::checkpoint&)> save;
  std::function<void(const worker_progress&)> on_progress;
  std::string task_name;                ///< "/job:worker/task:2": how aggregators name it
  std::string address;                  ///< its node's host:port, for the same
  /// A straggler on purpose (tests, benches): each step starts this much later.
  std::chrono::milliseconds step_delay{0};
  /// Set by the client to end the job early (the REPL's `train stop`): the
  /// worker checks it before each step and ends with af_error::cancelled.
  std::shared_ptr<const std::atomic<bool>> stop;
  /// Filled (if given) when the worker ends through `stop`, before `done`.
  std::shared_ptr<stopped_counts> stopped;
  /// A ps whose data plane broke (its process died: peer_down, unreachable):
  /// called on a thread of its own (it blocks, bounded by the config's
  /// ps_recovery_timeout_ms) with the shard's index, the step being pushed
  /// to it and why the push failed. It waits for the ps to come back and, on
  /// the chief, restores that ps's variables from the latest checkpoint
  /// (run_worker_task); the worker then pushes that shard's part again, at
  /// the restored step. `held`: the chief's checkpoint found it dead while
  /// the chief held the round (sync), so it died at the chief's step. An
  /// error (the ps did not come back in time, the chief is gone) fails the
  /// worker with it. Empty: a broken ps fails the worker at once.
  std::function<caf::expected<recovered_shard>(size_t shard, uint64_t step,
                                               const std::string& why, bool held)>
    recover_ps;
  /// With recover_ps: ps `shard`'s aggregator looked up anew (called on the
  /// same thread), for a worker it took as left when their link broke (a
  /// ps stopped past connection_timeout_ms), which joins it again.
  std::function<caf::expected<aggregator_actor>(size_t shard)> find_ps;
  /// Test hook: changes the gradients of a step before they are pushed.
  std::function<void(uint64_t local_step, std::vector<tensor>& grads)> tamper;
  /// Test hook: called on shard `shard`'s link thread just before this
  /// worker's push of local step `local_step` goes to that ps (not for
  /// pulls); it may block to hold that one push back (a test orders the
  /// pushes of a step around a live switch of each ps).
  std::function<void(size_t shard, uint64_t local_step)> before_push;
};

/// The data position (train::checkpoint::data_position) of a worker that
/// started at global step `start_step` and data position `start_position`
/// and has run `local_steps` steps, when the job's global step is
/// `global_step`: the index of the next global batch to read.
///   sync, average, allreduce: every worker reads one slice of every global
///     batch in lockstep, so it is start_position + local_steps, the same on
///     every worker.
///   async: the workers read at their own pace, and every push consumes one
///     slice; `workers` slices make a global batch, so it is start_position +
///     (global_step - start_step) / workers: the global batches the job has
///     consumed, whichever worker read them. Every worker resumes there.
uint64_t data_position(const std::string& mode, uint32_t workers, uint64_t start_step,
                       uint64_t start_position, uint64_t local_steps, uint64_t global_step);

/// Adds the variables of one aggregator's snapshot (values, and slots named by
/// train::slot_names(optimizer_kind)) to `ckpt`.
void add_variables(train::checkpoint& ckpt, const aggregator_state& state,
                   const std::string& optimizer_kind);

/// Replaces the variables in `ckpt` that add_variables took from the shards'
/// snapshots (their pieces) with the logical parameters assembled from them,
/// values and slots, in parameter order: checkpoints hold the model's
/// parameters, not how one job cut them. An error names a missing piece.
caf::error assemble_variables(train::checkpoint& ckpt, const std::vector<train::parameter>& params,
                              const std::vector<param_shard>& shards);

/// Puts the shards' states (one per shard, in shard order, as their
/// aggregators saved them) into `ckpt`: their variables (add_variables)
/// assembled into the logical parameters (assemble_variables), and the latest
/// of their global steps if it is past ckpt's.
caf::error add_shard_states(train::checkpoint& ckpt, const std::vector<aggregator_state>& states,
                            const std::vector<train::parameter>& params,
                            const std::vector<param_shard>& shards,
                            const std::string& optimizer_kind);

/// Spawns a worker; `done` is called once, on the worker's thread, after the
/// actor has ended (it ran its steps, or failed: the error names the step and
/// what failed) and told every actor that watches it, so that its caller may
/// destroy the actor system next (actors/result_at_exit.hpp). Watch the
/// returned handle only where being told after `done` is fine.
caf::actor spawn_worker(caf::actor_system& sys, worker_setup setup,
                        std::function<void(caf::expected<worker_result>)> done);

} // namespace af
