#pragma once
/// The aggregator actor's parts (dist/aggregator.hpp), shared by its files:
/// aggregator_members.cpp (who may push: joins, tokens, push numbers),
/// aggregator_update.cpp (a push applied to every variable or none),
/// aggregator_rounds.cpp (sync and average rounds, ssp's bound, the sweep),
/// aggregator_handlers.cpp (stats, done, join, switch, save, restore) and
/// aggregator.cpp (one behavior per mode). Internal to dist/.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "caf/all.hpp"

#include "dist/aggregator.hpp"

namespace af {

/// The aggregator's lock and what its data-plane path needs besides the
/// state (dist/aggregator.hpp, aggregator_plane).
struct aggregator_plane {
  /// Held by every handler of the actor and by the data plane's path for
  /// all they do to the state: members, tokens, push numbers, the round,
  /// the global step, stats, and the variables' rows and slots (an update
  /// to several variables is one step under it).
  std::mutex mtx;
  /// Where a data-plane thread waits for its parked sync push.
  std::condition_variable answered;
  /// The actor, while it runs (set by its first behavior, cleared when its
  /// state goes); only its state is touched from a data-plane thread.
  aggregator_impl_actor::stateful_pointer<aggregator_actor_state> self = nullptr;
  /// The actor's address, for the timer a data-plane thread arms (sweep).
  caf::actor_addr addr;
  /// Bits every push reply of this aggregator carries (wire::reply_flags:
  /// whole_pushes, set by the tuner of pipeline_sync = "auto"); read by
  /// the data plane's threads as they reply (plane_push_paths::reply_flags).
  std::atomic<uint16_t> reply_flags{0};
};

} // namespace af

namespace af::aggregator_detail {

using self_pointer = aggregator_impl_actor::stateful_pointer<aggregator_actor_state>;
using clock_type = std::chrono::steady_clock;
using push_result = caf::result<uint64_t, tensor, bool>;
using tickets = std::vector<std::pair<uint32_t, push_ticket>>;

/// The aggregator's lock, held by each of its actor's handlers.
std::unique_lock<std::mutex> hold(self_pointer self);

/// The data plane's path for `plane`'s sparse pushes (plane_push_paths::sparse):
/// async applies the push at once; sync takes it into the round, and the
/// last push of a round applies it and answers every waiting member. Any
/// other case (a retry, a late or early step, a worker on standby, a round
/// that holds CAF promises, ssp, a push that is not its member's) is left
/// to the actor untouched.
plane_sparse_push plane_path(std::shared_ptr<aggregator_plane> plane);

/// The same for `plane`'s dense pushes (plane_push_paths::dense), sync and
/// async, with the answer's parameters in the push's answer_parts.
plane_dense_push plane_dense_path(std::shared_ptr<aggregator_plane> plane);

/// Whether a push is one the data plane takes itself (its member's, a new
/// push number, the step the aggregator is at, and in sync a round it has
/// not pushed to, no worker on standby, no CAF promise parked): everything
/// the actor's push handlers check before they change anything.
bool common_case(const aggregator_actor_state& st, uint32_t worker, uint64_t step,
                 const push_credentials& who, bool sync);

/// A data-plane thread's wait for its pushes of sync rounds: one at a time
/// per thread, reused (no allocation per push).
std::shared_ptr<plane_wait> thread_wait();

/// The data plane's path for `plane`'s streamed dense pushes
/// (plane_push_paths::streamed, dist/aggregator_pipelined.cpp): a sync push
/// in the common case joins the pipelined round (started by the round's
/// first push); any other is left to the actor.
plane_streamed_push streamed_path(std::shared_ptr<aggregator_plane> plane);

/// What a streamed push's side of a pipelined round shares, sync's and
/// async's: the round, its buffer and its answer's pieces.
class round_member : public streamed_push {
public:
  round_member(std::shared_ptr<aggregator_plane> plane, std::shared_ptr<pipelined_round> round,
               uint32_t worker)
    : plane_(std::move(plane)), round_(std::move(round)), worker_(worker),
      buffer_(round_->buffer(worker)) {
    // nop
  }
  size_t total() const override { return round_->total(); }
  std::string where(size_t index) const override { return round_->where(index); }
  float* buffer() override { return buffer_; }
  void answer_pieces(size_t from, size_t to, std::vector<iovec>& out) const override {
    round_->answer_pieces(from, to, out);
  }

protected:
  std::shared_ptr<aggregator_plane> plane_;
  std::shared_ptr<pipelined_round> round_;
  uint32_t worker_;
  float* buffer_;
};

/// The aggregator's variables as a pipelined round takes them (flat order).
std::vector<pipelined_round::variable> round_variables(const aggregator_actor_state& st);

/// async: a dense push streamed in the common case (the plane's lock held):
/// it joins the aggregator's line of streamed pushes
/// (aggregator_actor_state::pipelined_async; dist/aggregator_pipelined_async.cpp)
/// and is applied chunk by chunk once it is first in line. Nothing when it
/// is not the common case (or a norm guard needs the whole gradient first):
/// the actor takes it store-and-forward.
std::optional<caf::expected<std::unique_ptr<streamed_push>>>
join_streamed_async(std::shared_ptr<aggregator_plane> plane, uint32_t worker, uint64_t step,
                    const push_credentials& who);

/// async: ends every push in the line of streamed pushes for `why` (a
/// switch, a restore, the actor's end): none of them changes a variable,
/// each is counted as refused; their threads hear it, and so do the whole
/// pushes' promises if `answer_whole` (not from the state's destructor).
void abort_streamed_async(aggregator_actor_state& st, const caf::error& why,
                          bool answer_whole = true);

/// async: a refusal if `worker`'s push `seq` is one it already has in the
/// line (sent again: applied once); none otherwise.
caf::error resent_in_line(const aggregator_actor_state& st, uint32_t worker, uint64_t seq);

/// async: a push with values that came whole (store and forward: shared
/// memory, TLS, CAF) while pushes are in the line of streamed ones
/// (counted and checked by take_gradient): its values are checked as
/// apply_now checks them, and it takes its place in the line; the answer
/// (a promise) comes when it is applied, by apply_now, in its turn.
push_result queue_whole_async(self_pointer self, uint32_t worker, uint64_t step,
                              const push_credentials& who, std::vector<tensor>& grads);

/// async, the actor's sweep: applies the whole pushes at the head of the
/// line, refuses a stalled head (stalled_head), and sweeps again while the
/// line holds any push.
void sweep_async_line(self_pointer self);

/// How long a streamed push at the head of the line may send nothing while
/// others wait behind it: a quarter of the step timeout. It scales with
/// what the job allows a step (a fixed bound would refuse an honest sender
/// on a slow link, or let a stalled one hold a fast job for long), and
/// leaves the pushes behind it most of their own step timeout; a head
/// stalled for it is refused by the sweep, which runs as often.
constexpr uint32_t stalled_head_bound(uint32_t step_timeout_ms) {
  return step_timeout_ms / 4;
}

/// async: refuses the head of the line if it is a streamed push that sent
/// nothing for stalled_head_bound while another waits behind it (lock
/// held); true if it did (the next one's turn has come).
bool stalled_head(aggregator_actor_state& st);

/// sync, a pipelined round in progress: a push that came to the actor (over
/// CAF, or store-and-forward on a data plane: a worker with pipeline_sync on
/// sends one wherever its connection is not plain TCP). A member that has
/// not streamed yet joins it: its values (`values`, checked as unpack
/// checks them; `what` names them) are copied into the round whole, or, an
/// abstention (no values), the round goes on without it. Any other is
/// refused, naming why.
push_result join_pipelined(self_pointer self, uint32_t worker, uint64_t step,
                           const push_credentials& who, const std::vector<tensor>& values,
                           const char* what);

/// The pipelined round's commit, once its last chunk is applied: the new
/// values installed, then the store-and-forward release's bookkeeping
/// (applied, global step, every member's ticket answered).
void commit_pipelined(self_pointer self);

constexpr size_t staleness_buckets = 16;
constexpr size_t max_events = 32;
/// The highest worker index a join may use (a task index is at most 65535).
constexpr uint32_t max_worker_index = 65535;

/// "worker 2 (/job:worker/task:2 at 10.0.0.3:3334)", or "worker 2" before it joined.
std::string worker_name(const aggregator_actor_state& st, uint32_t w);

/// Worker `w`'s entry (made, with those below it, if it has none yet).
aggregator_member& member(aggregator_actor_state& st, uint32_t w);

/// "3 members push" / "1 member pushes".
std::string members_pushing(uint32_t n);

/// A membership or mode change: logged, and kept for the progress line.
void add_event(aggregator_actor_state& st, std::string what);

/// Counts a push of `worker` (its time, for its rate and idleness).
void note_push(aggregator_actor_state& st, uint32_t worker, uint64_t step);

/// A new member token: 128 random bits from OpenSSL's CSPRNG.
caf::expected<std::string> new_token(const aggregator_actor_state& st);

/// True if `token` is `m`'s (compared in constant time).
bool holds_token(const aggregator_member& m, const std::string& token);

/// A push, or a done, that does not carry the token `worker` joined with:
/// refused, logged with where it came from, and nothing changes.
caf::error stranger(self_pointer self, uint32_t worker, const char* what,
                    const std::string& from);

/// Whether `worker` may push: it holds its token, is in the job, and is not done.
caf::error check_worker(self_pointer self, uint32_t worker, const push_credentials& who);

/// True if the aggregator already took `worker`'s push number `seq` (a
/// retry after its answer was lost, perhaps across a restore): it is
/// answered with the parameters and not applied again. 0 is unnumbered.
bool already_taken(aggregator_actor_state& st, uint32_t worker, uint64_t seq);

/// A worker that goes away (its actor down, or done after it joined);
/// `link_down`: its actor went down (aggregator_member::link_down).
void depart(self_pointer self, uint32_t worker, const std::string& why, bool link_down = false);

/// The flat parameters of the current global step (made once per step).
caf::expected<tensor> params(self_pointer self);

/// The answer "here is where the job stands": the global step and the
/// parameters; `dropped_late`: the push answered was dropped as late (sync).
push_result answer_now(self_pointer self, bool dropped_late = false);

/// answer_now for the push `who`: where its data plane wants the parameters
/// as the variables hold them (push_credentials::parts), they go there and
/// the answer's params tensor is empty (no flat copy is made).
push_result answer_now(self_pointer self, const push_credentials& who, bool dropped_late = false);

/// Shares every variable's value into `out` (answer_parts): true if it did;
/// false where the answer carries the flat tensor instead (an aggregator
/// with tables answers no parameters; a variable without a float32 value:
/// params() says why).
bool fill_parts(self_pointer self, answer_parts& out);

/// Drops the cached flat parameters (they changed, or are about to).
void invalidate(self_pointer self);

/// The pushed values as one pointer per variable, after checking their
/// shapes and that every element is finite. Errors name the worker and the
/// variable; a value that is not finite is af_error::non_finite.
/// `finite_checked`: this node's data plane already found every element
/// finite (push_credentials::finite_checked), so only the shapes are checked.
caf::expected<std::vector<const float*>> unpack(self_pointer self, uint32_t worker,
                                                const std::vector<tensor>& values,
                                                const char* what, bool finite_checked = false);

/// What an update is ("mean gradient of global step 7"), for its error
/// messages only: made when one is, not on every update. Refers to a string
/// or to a callable returning one, which must outlive it (pass a named
/// lambda, or a temporary in the call's own arguments).
class update_what {
public:
  update_what(const std::string& text) // NOLINT: a plain text converts
    : obj_(&text), make_([](const void* o) { return *static_cast<const std::string*>(o); }) {
  }
  template <class F,
            class = std::enable_if_t<std::is_invocable_r_v<std::string, const F&>
                                     && !std::is_convertible_v<const F&, std::string>>>
  update_what(const F& make) // NOLINT: a callable converts
    : obj_(&make), make_([](const void* o) { return (*static_cast<const F*>(o))(); }) {
  }
  std::string str() const { return make_(obj_); }

private:
  const void* obj_;
  std::string (*make_)(const void*);
};

/// Applies one update, `parts[i]` being variable i's floats: a gradient
/// (sync, async) or new values (average). Either every variable takes it or,
/// if prepare_update refuses, none does.
caf::error update_all(self_pointer self, const std::vector<const float*>& parts,
                      const update_what& what);

/// update_all of the round's mean gradient (sync), made and applied block by
/// block (variable_cell::apply_gradient_by): the same update, bit for bit,
/// in one pass over the pushed values and the variables.
/// With `flat` (and several variables): also the updated parameters, flat,
/// as params() would make them (empty if there was no memory for them).
caf::error update_all_by_mean(self_pointer self, const update_what& what,
                              tensor* flat = nullptr);

/// The gradient-norm guard (spec.grad_norm_guard): a gradient whose norm is
/// over the bound is scaled down to it into `scaled`, and `parts` point
/// there; counted on its worker, and logged at its 1st, 2nd, 4th, ... time.
void guard_gradient(self_pointer self, uint32_t worker, std::vector<const float*>& parts,
                    std::vector<float>& scaled);

/// A gradient applied at once (async, ssp), with its staleness counted.
caf::error apply_now(self_pointer self, uint32_t worker, uint64_t step, const push_credentials& who,
                     const std::vector<tensor>& grads, bool moves_step);

/// A push of the kind the mode does not take, after a live switch.
caf::error other_kind(const aggregator_actor_state& st, uint32_t worker, const char* sent);

/// A push of a step the aggregator has not reached (sync, async, ssp).
caf::error ahead_of(const aggregator_actor_state& st, uint32_t worker, uint64_t step);

// -- sparse pushes (aggregator_sparse.cpp): aggregators with tables --------

/// A sparse push checked: per variable, a dense one's floats (null for a
/// table) or a table's ids and rows (empty for a dense one).
struct sparse_parts {
  std::vector<const float*> dense;
  std::vector<tensor> ids, rows;
  std::vector<float> scaled; ///< the norm guard's scaled dense floats (dense points here)
};

/// The pushed values of a sparse push, checked as unpack checks a dense one
/// and every id of every table in range (invalid_argument naming the id,
/// the table and the node), before anything changes.
caf::expected<sparse_parts> unpack_sparse(self_pointer self, uint32_t worker,
                                          const sparse_push_values& values);

/// The norm guard over a sparse push: the norm of its dense values and its
/// rows together; a push over the bound is scaled down (rows copied).
void guard_sparse(self_pointer self, uint32_t worker, sparse_parts& parts);

/// A sparse push applied at once (async, ssp, sync's standby), counted as apply_now counts.
caf::error apply_sparse_now(self_pointer self, uint32_t worker, uint64_t step,
                            const push_credentials& who, const sparse_push_values& values,
                            bool moves_step);

/// sync: the sparse push of `worker` joins the round (its dense values
/// summed by the round, its tables' rows kept on its member), parked, and
/// the round released once complete.
push_result join_round_sparse(self_pointer self, uint32_t worker, uint64_t step,
                              const push_credentials& who, sparse_push_values& values);

/// join_round_sparse's first half, both paths': the values checked and
/// added to the round (or an abstention counted), not yet parked. The round
/// takes `values` (moved from).
caf::error add_to_round_sparse(self_pointer self, uint32_t worker, sparse_push_values& values);

/// sync's release for table `i`: the members' ids of the round
/// concatenated, their rows scaled by 1 / contributions, applied once.
caf::error apply_table_mean(self_pointer self, size_t i, variable_cell& cell);

/// The counters of an applied gradient (async, ssp): staleness, applied,
/// the push number taken, and the global step moved if `moves_step`.
void count_applied(self_pointer self, uint32_t worker, uint64_t step, uint64_t seq,
                   bool moves_step);

/// A push of the form the aggregator does not take: a plain push to one
/// with tables, a sparse push to one without (or to average).
caf::error wrong_form(const aggregator_actor_state& st, uint32_t worker, bool sparse_sent);

/// What an answer to a push carries: the parameters, or nothing when the
/// aggregator has tables (a worker reads the rows it needs).
caf::expected<tensor> answer_params(self_pointer self);

/// What makes `spec.sparse` unusable over `vars`: a name not among the
/// variables, a table of rank 0, average mode.
caf::error check_tables(const aggregator_spec& spec,
                        const std::vector<variable_directory::entry>& vars);

/// Answers every parked push of a released round with the parameters.
void answer_all(self_pointer self, tickets waiting);

/// answer_all's answers without its accounting: a data-plane thread's
/// ticket with the step, a promise with the parameters.
void answer_tickets(self_pointer self, tickets& waiting);

/// "worker 1 (/job:worker/task:1 at h:p, last push 2.1 s ago), worker 3": whom the round waits for.
std::string missing_names(const aggregator_actor_state& st);

/// Answers every parked push of an abandoned round with `err`.
void fail_all(aggregator_actor_state& st, tickets waiting, const caf::error& err);

/// `now - t` in milliseconds.
std::chrono::milliseconds since(clock_type::time_point t, clock_type::time_point now);

/// The next sweep (a timer message), unless one is pending or no timeout is set.
void schedule_sweep(self_pointer self);

/// ssp's held pushes and the round in progress: named when they wait long,
/// closed at a deadline (sync), failed at the step timeout.
void sweep(self_pointer self);

/// A dense push's values checked (unpack), guarded (not in average) and
/// added to the round (sync keeps them by reference), or an abstention
/// (no values) counted; not yet parked. Both paths' (join_round's, the
/// data plane's).
caf::error add_to_round(self_pointer self, uint32_t worker, const push_credentials& who,
                        const std::vector<tensor>& values, const char* what);

/// Parks the push of `worker` for `step` until the round completes.
/// Where `who` wants its answer as answer_parts, the ticket holds them.
push_result park(self_pointer self, uint32_t worker, uint64_t step, const push_credentials& who);

/// park's part that both paths share: `ticket` into the round, the member's
/// push number and park time noted.
void park_ticket(aggregator_actor_state& st, uint32_t worker, uint64_t step, uint64_t seq,
                 push_ticket ticket);

/// schedule_sweep from any thread: the timer message goes to the actor at `addr`.
void schedule_sweep(aggregator_actor_state& st, const caf::actor_addr& addr);

/// One pointer per variable into `flat`, at the variables' offsets.
std::vector<const float*> parts_of(const aggregator_actor_state& st, const std::vector<float>& flat);

/// sync: the mean of the round's gradients, applied once.
void release_sync(self_pointer self);

/// average: the mean of the round's parameters becomes every variable's value.
void release_average(self_pointer self);

/// After a member came, went or was done: what its mode may now release.
void reconsider(self_pointer self);

/// The clock of the slowest member still pushing (UINT64_MAX if none).
uint64_t slowest_clock(const aggregator_actor_state& st);

/// ssp: whether `worker` is at most `staleness` pushes ahead of the slowest member.
bool within_bound(const aggregator_actor_state& st, uint32_t worker);

/// Answers the held pushes the bound now lets go (all of them when a
/// switch drains the mode).
void release_ssp(self_pointer self, bool all = false);

/// stats: the job's counters, with every member's status and rates now.
aggregator_stats stats_of(self_pointer self);

/// done: a worker says it finished (or failed, with why); a joiner leaves.
caf::result<uint32_t> on_done(self_pointer self, uint32_t worker, const std::string& token,
                              const std::string& error);

/// closed: whether a push of `step` from `worker` would be dropped as late
/// now (sync); a true answer is counted as a step the worker skipped.
caf::result<uint64_t, bool> on_closed(self_pointer self, uint32_t worker, uint64_t step,
                                      const std::string& token);

/// join: a worker's name, address and actor (monitored), and its token.
caf::result<uint64_t, std::string, uint64_t> on_join(self_pointer self, uint32_t worker,
                                                     const std::string& task,
                                                     const std::string& address,
                                                     uint32_t batch_size, caf::actor& who);

/// switch: a live switch to `want`'s mode (or only its settings).
caf::result<uint64_t> on_switch(self_pointer self, aggregator_spec& want);

/// save: every variable's value and slots, and the push numbers taken.
caf::result<aggregator_state> save_state(self_pointer self);

/// restore: the state of a checkpoint (all of it or nothing); the round in
/// progress is abandoned and the counters start over.
caf::result<uint64_t> restore_state(self_pointer self, aggregator_state& in);

/// The behavior of `mode` (aggregator.cpp): a live switch becomes it.
aggregator_impl_actor::behavior_type behavior_of(self_pointer self, const std::string& mode);

/// What makes a spec unusable (an unknown mode, a bad optimizer, guard or
/// min_replicas), named; none if it is good.
caf::error check_spec(const aggregator_spec& spec);

} // namespace af::aggregator_detail
