#pragma once
/// The aggregation actors (protocol: messages/aggregator.hpp). One behavior
/// per mode; a node spawns the one its spec names (spawn_aggregator), so that
/// choosing sync, async or averaging is choosing an actor, never a branch in
/// the worker. They update the variables through their cells
/// (actors/variable.hpp): optimizer slots live beside the values.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/actor_addr.hpp"
#include "caf/actor_system.hpp"
#include "caf/expected.hpp"
#include "caf/typed_response_promise.hpp"

#include "actors/node.hpp"
#include "actors/plane_push.hpp"
#include "actors/push_gate.hpp"
#include "dist/aggregation_round.hpp"
#include "dist/pipelined_round.hpp"
#include "net/data_plane.hpp"
#include "dist/norm_guard.hpp"
#include "dist/pipeline_tuner.hpp"
#include "messages/aggregator.hpp"

namespace af {

/// The aggregator's full interface: the protocol plus its timer.
using aggregator_impl_actor = aggregator_actor::extend<caf::reacts_to<sweep_atom>>;

/// What an aggregator's actor and its node's data-plane threads share: the
/// lock under which either touches the aggregator's state, so that a sparse
/// push is taken on the data plane's thread that read it (its own path,
/// dist/aggregator_plane.cpp) while joins, departures, switches, deadlines
/// and status stay the actor's. Defined in dist/aggregator_detail.hpp.
struct aggregator_plane;

/// A data-plane thread's wait for its parked sync push (push_ticket::wait).
struct plane_wait {
  /// The push the thread waits for now (read by a ticket's deliver under
  /// another aggregator's lock than the one its thread waits under).
  std::atomic<uint64_t> generation{0};
  bool answered = false;
  uint64_t global_step = 0;
  bool dropped_late = false;
  caf::error error;
  /// A dense push's flat parameters, where its ticket's answer_parts could
  /// not take them (otherwise empty: they are in the parts).
  tensor params;
};

/// A push parked in a round: answered through its actor's promise, or, for
/// a push a data-plane thread took (dist/aggregator_plane.cpp), through
/// `wait`, on which that thread waits. Delivered under the aggregator's lock.
struct push_ticket {
  caf::typed_response_promise<uint64_t, tensor, bool> promise;
  std::shared_ptr<plane_wait> wait;  ///< null: a CAF push
  uint64_t generation = 0;           ///< the push of `wait` this ticket answers
  std::condition_variable* answered = nullptr; ///< what the waiting thread sleeps on
  /// A CAF push from this node's data plane that takes the answer's
  /// parameters as the variables hold them (push_credentials::parts).
  std::shared_ptr<answer_parts> parts;

  void deliver(uint64_t global_step, const tensor& params, bool dropped_late);
  void deliver(const caf::error& err);
};

/// A worker as its aggregator knows it: who, and its counters.
struct aggregator_member {
  bool joined = false;         ///< it sent join (name, address, monitor)
  bool left = false;           ///< its actor went down, or it said done after joining
  /// With `left`: it left because its actor went down (a killed process,
  /// or a link that broke: a process stopped past connection_timeout_ms),
  /// not by saying done; its pushes are refused as af_error::left (it
  /// joins again), at global step `left_at` for `left_why`.
  bool link_down = false;
  uint64_t left_at = 0;
  std::string left_why;
  bool fresh = false;          ///< sync after a switch: its next push joins the round at any step
  bool contributed = false;    ///< its values are in the round in progress
  bool idle_logged = false;    ///< named as idle since its last push
  /// sync after a switch: its pushes applied at once while on standby
  /// (aggregation_round::set_standby), and whether that was named
  uint64_t standby_pushes = 0;
  bool standby_logged = false;
  caf::actor_addr actor;       ///< monitored
  /// Issued at its join (16 random bytes): its pushes and its done carry it.
  /// Empty before it joined.
  std::string token;
  /// The last push number taken from it (push_credentials::seq), and the
  /// number of its push in the round in progress (taken once it is released).
  uint64_t seq_taken = 0;
  /// sync: the number of its last push dropped as late (0: none), so that a
  /// retry of it (its answer lost) is answered "dropped as late" again.
  uint64_t seq_late = 0;
  uint64_t round_seq = 0;
  /// sync, an aggregator with tables: its (ids, rows) in the round in
  /// progress, per variable (empty for the dense ones), kept until the
  /// release applies the round's tables once.
  std::vector<tensor> round_ids, round_rows;
  uint64_t retries = 0; ///< pushes answered as already taken (logged 1st, 2nd, 4th, ...)
  std::chrono::steady_clock::time_point joined_at, first_push, last_push, parked_since;
  /// When it was last told its step had closed (a backup worker that skips
  /// the step is alive, though it pushes nothing).
  std::chrono::steady_clock::time_point last_skipped;
  worker_stats stats;
};

struct aggregator_actor_state {
  /// Detaches the data plane's path from the state (dist/aggregator_plane.cpp):
  /// a push that comes after goes to the actor, which is gone.
  ~aggregator_actor_state();

  aggregator_spec spec;
  std::vector<variable_directory::entry> vars;
  std::vector<size_t> sizes;   ///< elements per variable
  std::vector<size_t> offsets; ///< where each starts in a flat buffer
  size_t total = 0;
  /// Per variable: whether it is a table (spec.sparse: its gradients arrive
  /// as (ids, rows)), and where its gradient goes in the round's sum (the
  /// round sums only the dense variables: offsets without the tables).
  std::vector<bool> is_table;
  std::vector<size_t> round_offsets;
  size_t tables = 0;
  std::vector<std::string> slot_names;
  uint64_t global_step = 0;
  aggregator_stats stats;

  /// The parameters as one flat tensor, for the global step they were made at.
  tensor params;
  std::optional<uint64_t> params_step;

  /// sync: one step; average: one average (async: only its workers' done
  /// flags). The tickets answer the parked pushes.
  aggregation_round<push_ticket> round;
  /// sync: the round in progress when its members stream their pushes
  /// (wire::kind::push_streamed): null otherwise. Its tickets are the
  /// round's (`round`), which holds no values then.
  std::shared_ptr<pipelined_round> pipelined;
  /// sync with spec.pipeline_auto: which kind of round the workers are asked for.
  pipeline_tuner tuner;
  /// async: a streamed push applied chunk by chunk (a pipelined round of
  /// one member; dist/aggregator_pipelined_async.cpp), with what its commit
  /// counts as apply_now does; or a push that came whole (store and
  /// forward: shared memory, TLS, CAF) while streamed ones were in line,
  /// applied by apply_now when its turn comes and answered through `whole`.
  struct streamed_async {
    std::shared_ptr<pipelined_round> round; ///< null: a whole push
    uint32_t worker = 0;
    uint64_t step = 0; ///< the step the worker pushed
    uint64_t seq = 0;
    /// A streamed push: when its last chunk arrived, or it became the head
    /// of the line if later (a head that sends nothing for a while holds
    /// the pushes behind it: stalled_head_bound).
    std::chrono::steady_clock::time_point progressed;
    /// A whole push: its values (checked), who sent it, and its answer.
    std::vector<tensor> grads;
    push_credentials who;
    std::optional<push_ticket> whole;
  };
  /// async: the streamed pushes in the order they apply, and whole pushes
  /// that came while there were any. The first applies its chunks as they
  /// arrive; the others read theirs meanwhile and start, one after the
  /// other, once the one before commits or is aborted (so the variables
  /// take the same bits as store-and-forward pushes in that order). A whole
  /// push is never first: it is applied as soon as it would be.
  std::deque<streamed_async> pipelined_async;
  /// Tickets of the round in progress that are CAF promises: the data
  /// plane's path releases only a round without them (a promise is
  /// delivered from the actor's own thread).
  uint32_t round_promises = 0;
  /// Of them, tickets that take the answer as one flat tensor (no
  /// push_ticket::parts): the round's release builds it during the update
  /// only if there are any.
  uint32_t round_flat = 0;
  /// average: the most a completed round moved the global step (the workers'
  /// average_every); 0 before the first. Bounds the step of a round's first push.
  uint64_t average_stride = 0;
  /// average reached by a live switch: a plain push is a gradient from a
  /// worker that has not changed its loop yet (an aggregator made as average
  /// takes a plain push as parameters, as it always has).
  bool average_by_switch = false;
  bool sweep_pending = false;
  /// sync, async, ssp: the gradient-norm guard (off unless the spec's
  /// grad_norm_guard is set).
  norm_guard guard;
  /// Pushes and dones refused for not carrying their worker's token (logged
  /// at the 1st, 2nd, 4th, ...: a stranger in a loop cannot flood the log).
  uint64_t strangers = 0;
  /// sync: deadlines of the round in progress already acted on (a log line each).
  uint64_t deadline_periods = 0;
  std::vector<aggregator_member> members; ///< by worker index
  /// The node's data plane's copy of the members' tokens (null: none).
  std::shared_ptr<push_gate> gate;
  /// The lock shared with the data plane's path (never null once spawned).
  std::shared_ptr<aggregator_plane> plane;
  /// ssp: pushes answered once the slowest member catches up.
  struct ssp_wait {
    uint32_t worker;
    caf::typed_response_promise<uint64_t, tensor, bool> promise;
    std::chrono::steady_clock::time_point since;
    bool logged = false;
  };
  std::vector<ssp_wait> ssp_waiting;

  static constexpr const char* name = "aggregator";
};

/// Every mode an aggregator runs (a live switch goes between any two of them
/// but average).
bool aggregator_mode(const std::string& mode);

/// Spawns the aggregator `spec.mode` names over `vars` (the cells of
/// spec.variables, in order), in `sys`. An unknown mode, a variable that is not
/// float32, or no workers is an error naming it.
caf::expected<aggregator_actor> spawn_aggregator(caf::actor_system& sys, aggregator_spec spec,
                                                 std::vector<variable_directory::entry> vars,
                                                 std::shared_ptr<push_gate> gate = nullptr,
                                                 std::shared_ptr<plane_push_paths> paths = nullptr);

/// spawn_aggregator and aggregator_spec_difference, for start_node: what a
/// node that hosts training spawns when asked for an aggregator.
aggregator_services node_aggregators();

/// How `want` differs from `have` in what changes an aggregator's updates:
/// mode, variables, workers and (sync, async) the optimizer with its
/// schedule. Empty if it does not; else a clause naming each difference,
/// e.g. "optimizer lr 0.1 vs 0.2". A node's get-or-create refuses a second
/// spec that differs (already_exists).
std::string aggregator_spec_difference(const aggregator_spec& have, const aggregator_spec& want);

} // namespace af
