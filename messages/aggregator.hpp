#pragma once
/// The aggregation actors: where the gradients of data-parallel workers meet.
/// Choosing sync or async training is choosing which of these a node spawns
/// (dist/aggregator.hpp); the worker's code is the same for all of them.
///
/// One aggregator serves the variables of one ps node (TF places
/// SyncReplicasOptimizer's accumulators with their variables); the node spawns
/// it, by name, through (aggregator, aggregator_spec) on its node actor
/// (messages/node.hpp); asking again by name with a spec that differs in
/// mode, variables, workers or optimizer is already_exists naming the
/// difference. Its variables must exist on that node; it applies
/// updates through their cells, so optimizer slots stay beside the values.
///
/// Protocol (every reply may instead be an error of messages/error.hpp):
///   (push, uint32 worker, uint64 step, push_credentials who, vector<tensor> values)
///                                 -> (uint64 global_step, tensor params, bool dropped_late)
///        Only the member that joined as `worker` pushes for it: `who.token`
///        must be the token its join was answered with (compared in constant
///        time); a push with another token, or for an index that has not
///        joined, is invalid_argument, logged with `who.from` (where it came
///        from), and changes nothing. `who.seq` numbers the worker's pushes
///        to this aggregator (1, 2, ...; a retry sends the same number): a
///        push whose number the aggregator has already taken (applied, or
///        used in a round) is answered at once with the parameters and not
///        applied again; the numbers taken are part of save and restore, so
///        a push retried after its ps died and was restored from a
///        checkpoint that holds it counts once.
///        `values` holds one tensor per variable of the spec, in its order,
///        each of that variable's shape; or one flat float32 tensor of all of
///        them (what the data plane carries). What they are depends on the mode:
///        sync:    gradients computed at global step `step`. Answered when the
///                 step is released: once every member not done has pushed its
///                 gradient of that step, or its first replicas_to_aggregate
///                 have, or at step_deadline_ms with at least min_replicas;
///                 the mean is applied once and the global step moves on. A
///                 gradient of an older step is dropped, counted as late, and
///                 answered at once with the current parameters and
///                 `dropped_late` true, the one answer that sets it: the
///                 worker then asks `closed` before its next pushes (the
///                 global step alone cannot tell it: a push of step s
///                 dropped just after step s closed is answered s + 1, as
///                 one in time is). After a switch to sync, a worker's first
///                 push joins the round whatever its step.
///        async:   a gradient computed from the parameters of global step
///                 `step`: applied at once; its staleness (global step now -
///                 `step`) goes into the histogram.
///        ssp:     as async, and each push moves the worker's clock; the
///                 answer is held while the worker is more than `staleness`
///                 pushes ahead of the slowest member still pushing.
///        average: the worker's own parameters after `average_every` local
///                 steps, `step` being the local steps it has run. Answered
///                 once every worker not done has pushed its round: the mean
///                 becomes the value of every variable and the round's step
///                 the global step. A push's step may not run ahead:
///                 a step beyond the round's (or, for a round's first push,
///                 beyond the global step plus the largest stride a round has
///                 made) is invalid_argument naming the worker and the
///                 expected step, and the round goes on without it.
///        The answer is the new global step and all parameters as one flat
///        float32 tensor. A value that is not finite (NaN, Inf) is refused
///        (non_finite naming the worker, the variable and the element),
///        counted, and never reaches a variable. Workers check first and
///        abstain from such a step (a push with no values: the round goes
///        on without their contribution). A value of the wrong shape
///        is shape_mismatch naming the variable. A second push of one round
///        is already_exists. An update reaches every variable or none:
///        everything that could refuse it (a variable with no value yet is
///        uninitialized naming it) is checked for all of them first.
///   (push, params, uint32 worker, uint64 step, push_credentials who, vector<tensor> values)
///                                 -> as push (dropped_late false): values that
///        are parameters (average workers push these). A push of the kind the
///        mode does not take (parameters to sync/async/ssp; after a live
///        switch into average, a plain push, which is a gradient) is
///        mode_changed: the worker learns the mode (stats) and changes its loop.
///   (push, sparse, uint32 worker, uint64 step, push_credentials who, sparse_push_values values)
///                                 -> (uint64 global_step, tensor (empty), bool dropped_late)
///        A push to an aggregator with tables (aggregator_spec::sparse): each
///        table's gradient is the rows the step touched, (ids, rows); the
///        dense variables' stay dense. Everything said of push holds (tokens,
///        seq and retries, late drops, backup workers, deadlines, the
///        non-finite refusal, the norm guard over the dense values and the
///        rows together); in addition every id is checked before anything
///        changes: one out of a table's [0, rows) is invalid_argument naming
///        the id, the table and the node, and no variable changes. async and
///        ssp apply it at once (variable_cell::apply_sparse_gradient for the
///        tables: lazy momentum and Adam); sync keeps each member's (ids,
///        rows) for the round and applies at its release, once, the members'
///        ids concatenated with their rows scaled by 1 / contributions (the
///        mean dense sync applies; repeated ids add up). The answer carries
///        no parameters (a worker reads the rows it needs next step:
///        messages/variable.hpp's gather). An aggregator with tables refuses
///        a plain push (a table's dense gradient), one without them a sparse
///        push (invalid_argument, saying which to send).
///   (pull)                        -> (uint64 global_step, tensor params)
///   (closed, uint32 worker, uint64 step, string token) -> (uint64 global_step, bool closed)
///        sync: whether a push of `step` from the worker would now be
///        dropped as late (its step closed without it: a backup worker's, or
///        a straggler's), so that the worker skips computing and sending it
///        and pulls the parameters instead (dist/worker.hpp). Each `true`
///        is counted as a step the worker skipped (worker_stats::skipped).
///        Other modes answer false. The token is its join's (as a push's);
///        another is invalid_argument.
///   (stats)                       -> (aggregator_stats)
///   (done, uint32 worker, string token, string error) -> (uint32 workers_done)  the worker
///        pushes no more: sync and average stop waiting for it (a worker that
///        joined leaves). `error` is empty if it finished, else why it failed
///        (stats show it: the chief fails the job). Once the index has
///        joined, only its token retires it (a process refused at join, or
///        anyone else, cannot end a live member): another token is
///        invalid_argument. For an index that never joined (the chief marks
///        the workers a restored ps's survivor knew as done) no token is asked.
///   (join, uint32 worker, string task, string address, uint32 examples_per_push, actor who)
///                                 -> (uint64 global_step, string token, uint64 last_seq)
///        registers the worker's name
///        (every message about it uses it), monitors `who` (when it goes down
///        the worker leaves at once: no step waits for it), and makes a
///        worker beyond the spec's a member (sync then waits for it too).
///        Answers a new random 128-bit token (OpenSSL RAND_bytes) that the
///        worker's pushes and done carry from then on (an earlier
///        process's token of that index stops working), and the last push
///        number the aggregator took from the index (its next push numbers on).
///   (switch, aggregator_spec want) -> (uint64 global_step)  drains the mode (a
///        round in progress closes with what arrived; held pushes are let
///        go) and goes on in want.mode with want's replicas_to_aggregate,
///        step_deadline_ms, min_replicas and staleness, keeping the step,
///        the variables, the members and every counter. Between average and
///        the others the workers change their loop when a push of the other
///        kind is refused as mode_changed. Every member that joined with an
///        actor (and is not done) is told (switch, string aggregator, string
///        mode, uint64 step) of a switch to another mode. Into sync, it is
///        also on standby until it joins again (its
///        pushes are applied at once, the step staying; no round waits for
///        it); the worker joins every ps before its next push, so that its
///        rounds begin with the same step's push on each ps.
///   (save)                        -> (aggregator_state)  a consistent snapshot
///        between steps: values, optimizer slots, the global step and the
///        last push number taken from each worker
///   (restore, aggregator_state)   -> (uint64 global_step)  sets all of it, or
///        nothing if any part does not fit (shape_mismatch naming it). A
///        state without variables (names, values and slots all empty) sets
///        the global step and push numbers only: the variables were restored
///        by their node (a sparse job's table shards). A round
///        in progress (sync, average) is abandoned: its parked pushes are
///        answered with aborted naming the restore, and the next round starts
///        from the restored step.
/// A step that waits longer than the spec's step_timeout_ms for its workers
/// fails for those waiting with af_error::timeout naming the missing workers.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "caf/actor.hpp"
#include "caf/meta/type_name.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "messages/atoms.hpp"
#include "messages/serialization.hpp"
#include "core/tensor.hpp"
#include "train/optimizer.hpp"

namespace af::train {

/// Inspected in the namespace of their types, where CAF looks for them.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, schedule_spec& x) {
  return f(caf::meta::type_name("schedule_spec"), x.kind, x.decay_steps, x.decay_rate,
           x.total_steps, x.min_lr);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, optimizer_spec& x) {
  return f(caf::meta::type_name("optimizer_spec"), x.kind, x.lr, x.momentum, x.beta1, x.beta2,
           x.epsilon, x.schedule, x.initial_accumulator);
}

} // namespace af::train

namespace af {

struct aggregator_spec {
  std::string name;                    ///< unique on its node, e.g. "train/ps0"
  std::string mode = "sync";           ///< sync, async, ssp, average
  std::vector<std::string> variables;  ///< names of variables on this node, push order
  /// The workers 0..workers-1 it starts with (more may join). In a request
  /// to a node, 0 means: hand back the aggregator of this name as it is
  /// (a worker joining a running job, a status or switch client).
  uint32_t workers = 1;
  train::optimizer_spec optimizer;     ///< sync, async, ssp
  uint32_t step_timeout_ms = 30000;
  /// sync: the gradients a step uses (0: every member's); later ones of the
  /// step are dropped and counted as late.
  uint32_t replicas_to_aggregate = 0;
  /// sync: after this long a step closes with what arrived, if at least
  /// min_replicas did; else it logs whom it waits for, once per deadline.
  uint32_t step_deadline_ms = 0;
  uint32_t min_replicas = 1;
  uint64_t staleness = 3;              ///< ssp: steps a worker may run ahead of the slowest
  /// sync, async, ssp: a gradient whose L2 norm is over this many times the
  /// median of the recent ones is scaled down to that bound (0: off;
  /// dist/norm_guard.hpp).
  double grad_norm_guard = 0;
  /// The variables (of `variables`) that are tables trained sparsely
  /// (docs/sparse.md): their gradients arrive as (ids, rows), a push is a
  /// sparse push (push, sparse, ...), and its answer carries no parameters.
  /// average takes none (refused at the spawn).
  std::vector<std::string> sparse;
  /// sync: [train] pipeline_sync = "auto": the aggregator times pipelined
  /// and store-and-forward rounds and asks its workers for the faster kind
  /// (dist/pipeline_tuner.hpp); false: a round is pipelined when its
  /// members stream their pushes.
  bool pipeline_auto = false;
};

/// A sparse push's gradients (push, sparse): an aggregator with tables
/// (aggregator_spec::sparse) takes them, its dense variables' gradients
/// dense and its tables' as the rows a step touched. All three empty: an
/// abstention.
struct sparse_push_values {
  /// The dense variables' gradients, in the spec's order (tables skipped):
  /// one tensor each (its shape, or flat), or one flat float32 tensor of
  /// them all (what the data plane carries); none if every variable is a table.
  std::vector<tensor> dense;
  /// Per table, in the spec's order: the rows' ids (1-D int32 or int64
  /// [n], repeats allowed: they add up), and their gradients (float32 [n] +
  /// the table's shape[1:]).
  std::vector<tensor> ids;
  std::vector<tensor> rows;

  bool empty() const noexcept { return dense.empty() && ids.empty() && rows.empty(); }
};

/// One worker as an aggregator sees it (messages/aggregator.hpp's stats).
struct worker_stats {
  uint32_t worker = 0;
  std::string task;            ///< "/job:worker/task:2" once it joined; "" before
  std::string address;         ///< its node's host:port, once it joined
  /// member; held (ssp: its push waits for the slowest); done; left (died or
  /// went away); waiting (an index below the highest that never joined)
  std::string status;
  uint32_t batch_size = 0;     ///< examples per push, as it joined with
  uint64_t pushes = 0;         ///< gradients (average: parameters) it sent
  uint64_t applied = 0;        ///< of those, used in an update
  uint64_t late = 0;           ///< sync: arrived after their step closed: dropped
  uint64_t refused = 0;        ///< not finite, or it abstained, or (pipeline_async) abandoned
  uint64_t stale = 0;          ///< async, ssp: applied with staleness > 0
  uint64_t max_staleness = 0;
  uint64_t waited_ms = 0;      ///< time its pushes waited for others (a round, ssp's bound)
  uint64_t clock = 0;          ///< ssp: its pushes since it joined or the mode began
  uint64_t last_step = 0;      ///< the step of its last push
  double examples_per_s = 0;   ///< batch_size x pushes over its first to last push
  double idle_s = -1;          ///< since its last push (-1: none yet)
  /// Why it failed, as its done said ("" if it finished, or has not ended):
  /// the chief fails the job when a worker did.
  std::string error;
  uint64_t guarded = 0;        ///< pushes the gradient-norm guard refused or clipped
  /// sync: its steps it did not push here because this aggregator told it
  /// (closed) that their step had closed without it (a backup worker's)
  uint64_t skipped = 0;
};

struct aggregator_stats {
  std::string mode;
  uint64_t global_step = 0;
  uint64_t applied = 0;          ///< updates applied to the variables
  uint64_t pushes = 0;           ///< pushes received
  uint64_t pushes_on_plane = 0;  ///< of them, pushes (sparse, dense, streamed) taken on the data
                                 ///< plane's thread (dist/aggregator_plane.cpp,
                                 ///< aggregator_pipelined.cpp), not through the actor
  uint64_t dropped_stale = 0;    ///< sync: gradients of an old step (late)
  uint64_t refused = 0;          ///< non-finite values refused, and streamed async pushes
                                 ///< abandoned (a hang-up, a timeout, a stalled head, a switch)
  std::string last_refusal;      ///< the error of the last refusal
  std::vector<uint64_t> staleness; ///< async, ssp: [s] = gradients applied with staleness s
                                   ///< (the last bucket: s or more)
  uint32_t workers_done = 0;     ///< workers that said done or left
  uint32_t active = 0;           ///< members still pushing (the chief waits for 0)
  uint64_t closed_at_deadline = 0; ///< sync: steps closed with fewer than replicas_to_aggregate
  uint64_t switches = 0;         ///< live mode switches so far
  uint64_t pipelined_rounds = 0; ///< sync: rounds committed pipelined (streamed pushes)
  /// sync with pipeline_sync = "auto": what its tuner does now ("timing
  /// pipelined rounds", "store-and-forward rounds", ...; dist/pipeline_tuner.hpp).
  std::string pipeline_auto;
  std::vector<worker_stats> workers; ///< per worker (part 6 of training's accounting)
  /// Membership and mode changes, oldest first (the last 32), and how many
  /// there have been in all: a reader prints those it has not seen.
  std::vector<std::string> events;
  uint64_t events_total = 0;
};

struct aggregator_state {
  uint64_t global_step = 0;
  std::vector<std::string> names;
  std::vector<tensor> values;
  std::vector<std::vector<tensor>> slots; ///< per variable, train::slot_names order
  /// The last push number taken from each worker (push_credentials::seq),
  /// by index: a push retried after a restore counts once.
  std::vector<uint32_t> seq_workers;
  std::vector<uint64_t> seq_taken;
};

/// The parameters of a push's answer as the variables hold them, for this
/// node's data plane (push_credentials::parts): one tensor per variable, in
/// the spec's order, each sharing its variable's buffer (no copy is made:
/// the data plane writes them straight into the answer slot or the socket,
/// one after the other, the bytes of the flat tensor a push answers
/// otherwise). Read-only while held: the aggregator's next update of a
/// variable whose buffer a holder still shares writes a copy (copy on
/// write, actors/variable.hpp), so the bytes held never change.
struct answer_parts {
  std::vector<tensor> values;
};

/// Who a push speaks for (messages/aggregator.hpp's push): the token its
/// worker's join was answered with, the number of this push, and where it
/// came from for the log (the data plane fills in the peer's address).
struct push_credentials {
  std::string token;
  uint64_t seq = 0;
  std::string from;
  /// This node's data plane found every pushed float finite as it read them
  /// (while they were in cache), so the aggregator need not look again. Not
  /// serialized: a push from another node always arrives with false.
  bool finite_checked = false;
  /// Set by this node's data plane: the aggregator fills it with the
  /// answer's parameters (answer_parts) and answers an empty params tensor
  /// instead of building the flat one, where it can (a dense push answered
  /// with the parameters; a ticket of a sync round). It fills it before it
  /// answers, and the data plane's thread reads it only once the answer has
  /// come (the mailbox orders the two). Not serialized; mutable: the
  /// aggregator takes it out of the message (its copy is dropped before
  /// the answer goes, so the thread finds it its own again).
  mutable std::shared_ptr<answer_parts> parts = nullptr;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, aggregator_spec& x) {
  return f(caf::meta::type_name("aggregator_spec"), x.name, x.mode, x.variables, x.workers,
           x.optimizer, x.step_timeout_ms, x.replicas_to_aggregate, x.step_deadline_ms,
           x.min_replicas, x.staleness, x.grad_norm_guard, x.sparse, x.pipeline_auto);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sparse_push_values& x) {
  return f(caf::meta::type_name("sparse_push_values"), x.dense, x.ids, x.rows);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_stats& x) {
  return f(caf::meta::type_name("worker_stats"), x.worker, x.task, x.address, x.status,
           x.batch_size, x.pushes, x.applied, x.late, x.refused, x.stale, x.max_staleness,
           x.waited_ms, x.clock, x.last_step, x.examples_per_s, x.idle_s, x.error, x.guarded,
           x.skipped);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, aggregator_stats& x) {
  return f(caf::meta::type_name("aggregator_stats"), x.mode, x.global_step, x.applied, x.pushes,
           x.dropped_stale, x.refused, x.last_refusal, x.staleness, x.workers_done, x.active,
           x.closed_at_deadline, x.switches, x.pipelined_rounds, x.pipeline_auto, x.workers, x.events, x.events_total,
           x.pushes_on_plane);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, aggregator_state& x) {
  return f(caf::meta::type_name("aggregator_state"), x.global_step, x.names, x.values, x.slots,
           x.seq_workers, x.seq_taken);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, push_credentials& x) {
  return f(caf::meta::type_name("push_credentials"), x.token, x.seq, x.from);
}

using aggregator_actor = caf::typed_actor<
  caf::replies_to<push_atom, uint32_t, uint64_t, push_credentials, std::vector<tensor>>::with<uint64_t, tensor, bool>,
  caf::replies_to<push_atom, params_atom, uint32_t, uint64_t, push_credentials, std::vector<tensor>>::with<uint64_t, tensor, bool>,
  caf::replies_to<push_atom, sparse_atom, uint32_t, uint64_t, push_credentials, sparse_push_values>::with<uint64_t, tensor, bool>,
  caf::replies_to<pull_atom>::with<uint64_t, tensor>,
  caf::replies_to<closed_atom, uint32_t, uint64_t, std::string>::with<uint64_t, bool>,
  caf::replies_to<stats_atom>::with<aggregator_stats>,
  caf::replies_to<done_atom, uint32_t, std::string, std::string>::with<uint32_t>,
  caf::replies_to<join_atom, uint32_t, std::string, std::string, uint32_t, caf::actor>::with<uint64_t, std::string, uint64_t>,
  caf::replies_to<switch_atom, aggregator_spec>::with<uint64_t>,
  caf::replies_to<save_atom>::with<aggregator_state>,
  caf::replies_to<restore_atom, aggregator_state>::with<uint64_t>>;

} // namespace af
