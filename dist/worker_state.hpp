#pragma once
/// The worker actor's state and the functions its files share:
/// dist/worker.cpp (the step loop), worker_exchange.cpp (pushes, pulls,
/// joins, a ps that died, a live switch), worker_checkpoint.cpp (evaluation
/// and checkpoints) and worker_links.cpp (the detached actors that block for
/// it). Internal to dist/.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "caf/all.hpp"

#include "dist/worker.hpp"
#include "dist/worker_loop.hpp"

namespace af {
class data_channel;
class tls_context;
} // namespace af

namespace af::worker_detail {

using clock_type = std::chrono::steady_clock;
using allreduce_atom = caf::atom_constant<caf::atom("allreduce")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using recover_atom = caf::atom_constant<caf::atom("recoverps")>;
/// To itself: the answer of a push made on its own thread (worker_state::pushed).
using pushed_atom = caf::atom_constant<caf::atom("pushed")>;
/// To itself: the next step on its own thread, after one that ended without
/// a message between (worker_state::in_here).
using here_atom = caf::atom_constant<caf::atom("stephere")>;

/// What the recovery link hands the worker beside its reply (the reply is
/// the restored step): the shard as it runs again, by index.
struct recovery_box {
  std::mutex mtx;
  std::map<size_t, recovered_shard> done;
};

class plane_pusher;

/// The worker actor's state: its loop's counters (worker_loop) and the rest.
struct worker_state : worker_loop {
  worker_setup setup;
  /// Sets the worker's result, delivered once the actor has ended
  /// (worker_impl; actors/result_at_exit.hpp). Quit right after.
  std::function<void(caf::expected<worker_result>)> done;
  step_runner runner;
  /// The step on this actor's thread, when it can run there (else null:
  /// through `runner` and the executor).
  std::unique_ptr<step_here> here;
  /// Inside a step run by `here`, until its use_gradients returns. A step
  /// begun then (average's local steps between rounds: nothing is asked)
  /// goes through the mailbox (here_atom): run at once, each would nest in
  /// the last one's call, ~900 bytes of stack a step, until it overflowed.
  bool in_here = false;
  std::vector<caf::actor> links;  ///< per shard (none: `direct`)
  /// One shard: its connection, called on this actor's own thread (the
  /// worker is detached; a push has nothing to wait beside). Several shards
  /// push through their links at once.
  std::unique_ptr<plane_pusher> direct;
  /// A push made through `direct`, answered: taken at the next message
  /// (pushed_atom), not at once, which would run the next step (and push)
  /// inside this one's call, deeper each step.
  std::function<void()> pushed;
  caf::actor reducer;             ///< allreduce
  caf::actor recovery;            ///< waits for a ps that died (recover_ps)
  std::shared_ptr<recovery_box> recovered = std::make_shared<recovery_box>();
  uint64_t ps_recoveries = 0;     ///< ps tasks it waited for and went on with
  /// Called with a shard's index when its aggregator goes down (monitored
  /// with recover_ps): a control request to it (save, stats) is never
  /// answered by CAF then, and would wait its whole timeout.
  std::map<uint64_t, std::function<void(size_t)>> down_hooks;
  uint64_t next_hook = 0;
  /// Per shard: its aggregator went down and the shard was not recovered
  /// yet. CAF drops what is sent to a dead node's proxy without an answer,
  /// so a control request made after the down message would wait its whole
  /// timeout (60 s once in the soak): fire_known_down answers it at once.
  std::vector<bool> shard_down;
  /// Per shard (chief, sync): it died while this worker held the round (its
  /// checkpoint's save found it gone), so it cannot have closed a round past
  /// this worker's step: recover_ps restores it at this worker's step.
  std::vector<bool> held_round;
  std::optional<train::batcher> batches;
  std::vector<tensor> params;     ///< sync / async: as pulled
  std::optional<train::replica_state> own; ///< average / allreduce
  /// The gradient being pushed: after a switch into average it becomes the
  /// replica's first local step instead of being lost.
  std::vector<tensor> pending;
  /// [train] wire_dtype = "bf16": per parameter, what rounding its
  /// gradients to bf16 left out so far (with_feedback adds it to the next).
  std::vector<std::vector<float>> wire_residual;
  /// The last step's gradients (shared buffers), kept only by a chief that
  /// writes histograms (train_config::histogram_every): its reports carry them.
  std::vector<tensor> last_grads;
  /// Each shard's global step as it last answered: a push to shard k
  /// carries shard k's own (after a live switch the ps tasks' steps may
  /// differ for good; the least of them would be late on the others).
  std::vector<uint64_t> shard_step;
  /// Per shard: the token its aggregator answered this worker's join with
  /// (its pushes and done carry it; empty before the join), and the number
  /// of its last push there (a retry sends the same number again).
  std::vector<std::string> tokens;
  std::vector<uint64_t> push_seq;
  double loss_sum = 0;
  uint64_t loss_count = 0;
  double last_loss = 0;
  uint64_t refused = 0;
  /// sync with backup workers: it was late (a push's answer said it was
  /// dropped as late, or an aggregator said its step had closed), so it
  /// asks (closed) after its slow part whether
  /// its step closed without it; cleared by two pushes in time in a row
  /// (one may be luck: the others slow to start). A worker that keeps up
  /// asks nothing (no request on its step's path).
  bool late_suspect = false;
  uint32_t in_time = 0;           ///< pushes in time since it was last late
  /// This exchange: a shard answered that it dropped the push as late
  /// (messages/aggregator.hpp's dropped_late; the global step in the answer
  /// cannot tell: a push of step s dropped just after s closed gets s + 1).
  bool answered_late = false;
  /// Per shard, this step: the aggregator said the step closed without this
  /// worker, so its part is not pushed there, and the global step it said
  /// it is at (the round open there: skip_step goes on at it).
  std::vector<bool> closed;
  std::vector<uint64_t> closed_at;
  /// A step skipped without pulling the parameters (a worker that is not
  /// the chief: skip_step): they are older than global_step, and pulled
  /// before the next step computes on them.
  bool params_stale = false;
  uint64_t skipped = 0;           ///< steps it skipped: closed on every shard
  uint64_t pulls = 0;             ///< parameters pulled without a push (worker_result::pulls)
  uint64_t computed = 0;          ///< steps whose gradients it computed (worker_result::computed)
  uint64_t refused_in_a_row = 0;  ///< steps abstained from since the last finite one
  std::string last_refusal;
  uint64_t checkpoint_failures = 0; ///< checkpoints it could not write
  std::string checkpoint_error;     ///< the last one's reason
  clock_type::time_point started;
  clock_type::time_point last_checkpoint;
  bool finished = false;
  static constexpr const char* name = "worker";
};

using self_pointer = caf::stateful_actor<worker_state>*;

/// "worker 2": how its log lines and errors name it.
std::string who(self_pointer self);

/// Ends the worker with `err` (what it was doing: `during`): said to every
/// aggregator in its done, logged, and handed to `done` with the cause's code.
void fail(self_pointer self, caf::error err, const std::string& during);

/// Seconds from `t` to now.
double seconds_since(clock_type::time_point t);

/// The parameters the worker's next step runs with.
const std::vector<tensor>& current(self_pointer self);
/// Whether this worker's reports carry its parameters and gradients (the
/// chief of a job that writes TensorBoard histograms, worker_progress::values).
bool wants_histograms(const worker_setup& setup);

/// A sentence naming the worker, the variable and the element if `values`
/// (one per parameter) holds a NaN or an infinity; "" if all are finite.
std::string first_non_finite(self_pointer self, const std::vector<tensor>& values,
                             const char* what);

/// Counts and logs a step this worker abstains from; false (and the worker
/// failed) once it has abstained from max_nonfinite_steps steps in a row
/// (train_config): past that the model has diverged (or was restored
/// broken), and abstaining for ever would keep an async job from reaching
/// its step count, or let a job end "done" having applied nothing.
bool note_refusal(self_pointer self, std::string why);

/// Whether a push's error says the ps's process is gone (its data
/// connection closed, or it cannot be connected to): worth waiting for it.
bool ps_gone(const caf::error& err);

/// Runs `hook` with the shard's index if a shard's aggregator goes down
/// before the returned id is dropped (drop_hook).
uint64_t add_hook(self_pointer self, std::function<void(size_t)> hook);

/// Drops hook `id` (add_hook).
void drop_hook(self_pointer self, uint64_t id);

/// Runs hook `id` for each shard whose aggregator is known to be down
/// already (its down message came before the hook was added). Call it
/// after the requests the hook guards were sent.
void fire_known_down(self_pointer self, uint64_t id);

/// Examples behind one push: average pushes after average_every steps.
uint32_t examples_per_push(const worker_state& st);

/// One data-plane connection to a ps node and the blocking push and pull
/// calls on it (connected at the first call, again after it broke).
/// `before` (a test hook, may be empty) runs before each push with the
/// worker's local step. `bf16`: [train] wire_dtype = "bf16" (its pushes go
/// in bf16: data_channel::set_wire_bf16). Used from one thread at a time.
class plane_pusher {
public:
  plane_pusher(std::string host, uint16_t port, std::string peer, std::chrono::milliseconds timeout,
               std::function<void(uint64_t)> before, std::shared_ptr<tls_context> tls, bool bf16);
  ~plane_pusher();
  plane_pusher(const plane_pusher&) = delete;
  plane_pusher& operator=(const plane_pusher&) = delete;

  /// The ps's global step, the parameters it answered with (one flat
  /// tensor) and whether it dropped the push as late; or why not.
  caf::expected<std::tuple<uint64_t, tensor, bool>>
  push(const std::string& name, uint32_t worker, uint64_t step, const std::vector<tensor>& values,
       uint32_t wait_ms, uint8_t kind, uint64_t local_step, const std::string& token, uint64_t seq);

private:
  std::string host_;
  uint16_t port_;
  std::string peer_;
  std::chrono::milliseconds timeout_;
  std::function<void(uint64_t)> before_;
  std::shared_ptr<tls_context> tls_;
  bool bf16_;
  std::unique_ptr<data_channel> chan_;
};

/// A detached actor around a plane_pusher, so that a worker with several ps
/// shards pushes to all of them at once and never blocks.
caf::behavior plane_link(caf::event_based_actor* self, std::string host, uint16_t port,
                         std::string peer, std::chrono::milliseconds timeout,
                         std::function<void(uint64_t)> before, bool bf16);

/// [train] wire_dtype = "bf16", a gradient push (sync, async, ssp): `values`
/// (float32, one per parameter) rounded to bf16 with error feedback
/// (core/bf16.hpp's round_with_feedback over the worker's residuals, one
/// per parameter, kept from push to push). Else `values` as they are.
std::vector<tensor> with_feedback(worker_state& st, const std::vector<tensor>& values);

/// The setup's before_push hook bound to shard `k` (empty without one).
std::function<void(uint64_t)> before_push_of(const worker_setup& setup, size_t k);

/// A detached actor that waits for a ps that died to come back
/// (worker_setup::recover_ps blocks: it pings, and on the chief restores),
/// and looks a ps's aggregator up anew (worker_setup::find_ps).
caf::behavior recovery_link(caf::event_based_actor*,
                            std::function<caf::expected<recovered_shard>(
                              size_t, uint64_t, const std::string&, bool)>
                              fn,
                            std::function<caf::expected<aggregator_actor>(size_t)> find,
                            std::shared_ptr<recovery_box> box);

/// A detached actor that runs the blocking all-reduce of the worker's group.
caf::behavior reduce_link(caf::event_based_actor*, std::shared_ptr<allreduce_group> group);

/// Evaluates the current parameters on the held-out set (chief), then `then`.
void evaluate(self_pointer self, std::function<void(double, double)> then);

/// Collects the state to checkpoint (chief), then `then`.
void checkpoint(self_pointer self, std::function<void()> then);

/// Registers with every shard's aggregator (its name and address for their
/// messages, a monitor so that its death ends its membership at once, and,
/// for a worker not in the job's config, membership itself), then `then`.
void join_all(self_pointer self, std::function<void()> then);

/// Pushes (or pulls, if `values` is null) to every shard; `then` gets the
/// global step and the parameters once all have answered. Values that are
/// not finite are pushed to no shard: with several ps, a refusal by one
/// while the others applied their parts would apply part of a step.
void exchange(self_pointer self, const std::vector<tensor>* values, bool abstain_step,
              std::function<void(uint64_t, std::vector<tensor>)> then);

/// Whether this step asks its aggregators if it closed without this worker
/// (sync, a worker that was late: worker_state::late_suspect).
bool asks_closed(const worker_state& st);

/// Asks each shard's aggregator not known to have closed this step yet
/// whether it did (closed), marking worker_state::closed; then `then`. A
/// shard that is down, or does not answer, counts as open: its part is
/// pushed as before and a late one is dropped there.
void ask_closed(self_pointer self, std::function<void()> then);

/// True if every shard closed this step without this worker.
bool all_closed(const worker_state& st);

/// The step closed on every shard without this worker (a backup worker's,
/// TF's SyncReplicasOptimizer would drop its gradient): it is not computed
/// or not sent; the worker counts the step as skipped and goes on with the
/// next one, at the round each shard said is open. The chief pulls the
/// parameters now (its reports, evaluations and checkpoints use them), and
/// so does a worker once the job's last round has closed (its result
/// carries them); any other worker pulls them only before it computes
/// (run_step_now, pull_params): a straggler that finds its every step
/// closed moves no parameters but that last pull.
void skip_step(self_pointer self);

/// The parameters pulled (worker_state::params_stale), then `then`.
void pull_params(self_pointer self, std::function<void()> then);

/// After a step: report, evaluate, checkpoint as due; then the next step.
void after_step(self_pointer self);

/// What a step's gradients do in each mode.
void use_gradients(self_pointer self, std::vector<tensor> grads);

/// The job's steps are done: done to every aggregator, the chief's last
/// evaluation (and, average and allreduce, its last checkpoint), then `done`.
void finish(self_pointer self);

/// The next step, unless the worker ended or its client asked it to stop
/// (after step_delay, if any).
void run_step(self_pointer self);

} // namespace af::worker_detail
