#pragma once
/// The client API: a session on a cluster (TF's tf.Session(server.target)).
///
///   auto s = af::session::make(sys, spec, "/job:local/task:0");
///   auto cpu = s->device("/cpu:0");                 // tf.device scope
///   auto w = s->variable("w", {2, 2}, af::initializer::constant(2));
///   cpu.reset();                                    // leave the scope
///   auto sum = s->add(*w, *b);
///   s->initialize();                                // global_variables_initializer
///   af::run_trace trace;
///   auto values = s->run({sum}, &trace);            // sess.run + FULL_TRACE
///
/// Placement: a device name is merged into the enclosing scopes. Variables
/// that name no job or task go to task 0 of the session's job, so clients of
/// different servers of one job share them by name, as in TensorFlow's
/// tutorial; ops that name none run on the session's own task. A device that
/// the node does not have (e.g. /gpu:0 on a CPU-only node) falls back to the
/// node's CPU:0 when soft placement is on (the default), and the trace says so.
///
/// Running: the graph (graph/graph.hpp) is cut into one partition per device
/// (graph/partition.hpp); the asynchronous step runner (actors/step_runner.hpp),
/// hosted by an actor of the session, registers each partition with its
/// device's executor once per set of fetches and then only sends "run step N"
/// with the feeds. Values that cross partitions go executor to executor, never
/// through the client. Reading a variable, and updating one with a value the
/// client has, go straight to the variable (over the data plane when remote).
///
/// Failures: the session monitors every node it uses. After a node dies,
/// every call that needs it fails at once with peer_down saying so (after one
/// quick attempt to reconnect); once the node is back the same session works
/// again: it re-finds its variables by name, re-registers its graphs with the
/// new executors, and logs once that it reconnected. A variable that the
/// restarted node no longer holds is af_error::gone until initialize()
/// re-creates it. Executors forget a session's graphs when the session ends or
/// its process dies.
///
/// Updates are exactly-once: each assign / assign_add / assign_sub that the
/// client sends straight to a variable carries a random request id. When its
/// answer does not come (a timeout, a broken data connection), the session
/// sends it again with the same id, up to 3 tries within the op's timeout
/// (each try waits for a share of what is left), on a fresh data connection;
/// the variable applies an id once and answers a retry with the first result
/// (actors/variable.hpp says the bound). A timeout that remains means the
/// update was applied at most once, never twice, within the variable's last
/// 1024 updates (older ids are forgotten).
///
/// Every call that talks to the cluster is bounded by `session_options`'
/// timeouts and returns an error naming what it waited for. A session is used
/// by one thread at a time; it must be destroyed before its actor system.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/expected.hpp"

#include "actors/step_runner.hpp"
#include "actors/trace.hpp"
#include "config/cluster_spec.hpp"
#include "config/security.hpp"
#include "graph/graph.hpp"
#include "core/device_name.hpp"
#include "messages/aggregator.hpp"
#include "messages/kv_store.hpp"
#include "messages/node.hpp"

namespace af {

/// The variable calls made straight from the client (reads, and updates with
/// a value the client has) by the sessions given it (session_options::
/// variable_calls), by the way each went: over a node's data plane, or as an
/// actor message (CAF to another process, or a call into a node of this
/// process). A test checks that a session with the data plane off sent none
/// over it.
struct variable_call_counter {
  std::atomic<uint64_t> data_plane{0};
  std::atomic<uint64_t> actor_messages{0};
};

struct session_options {
  std::chrono::milliseconds timeout{10000};        ///< any one request
  std::chrono::milliseconds connect_timeout{5000}; ///< a whole connect: lookup, TCP, handshakes
  bool soft_placement = true;
  /// Variable ops on other processes' nodes go over the node's tensor data
  /// plane (net/data_plane.hpp); false sends them as CAF messages.
  bool data_plane = true;
  /// How long to poll for a data-plane reply before sleeping (0: never).
  /// Polling trades a little CPU of the waiting thread for round trips.
  std::chrono::microseconds reply_poll{50};
  /// When set, a run checks it every 20 ms and, once true, abandons the
  /// step and returns af_error::cancelled (the REPL's Ctrl-C). The step's
  /// partitions still end on their executors within the step's timeout.
  std::shared_ptr<const std::atomic<bool>> cancel;
  /// Called on the session's thread with each line the session logs when it
  /// recovers by itself: an update sent again after its answer was lost
  /// ("retry: assign_add of variable 'v' on ... (try 2 of 3)"), a node
  /// found again ("reconnected to /job:ps/task:0 at h:p (restarted)"). For
  /// programs that show them to a user, and for tests.
  std::function<void(const std::string&)> on_recovery;
  /// What the line of a restarted node says of the variables it lost (its
  /// "N variable(s) are gone: ..."): by default what a user does; a
  /// training job whose chief restores them itself (ps recovery) says so.
  std::string lost_hint = "initialize() or restore them";
  /// The cluster's [security]: with it, connections to nodes (CAF's and the
  /// data plane's) are mutual TLS. The actor system must be made with the
  /// same (system_config{node_options, security}); the files are checked at
  /// the first connection, with errors naming them.
  security_options security;
  /// Where this session counts its variable calls (shared by the sessions
  /// given the same one); none, the default, counts nothing. For tests.
  std::shared_ptr<variable_call_counter> variable_calls;
};

/// Where a node's clock stands against this session's (see run_trace).
struct clock_estimate {
  int64_t offset_ns = 0; ///< node's steady clock minus ours
  int64_t rtt_ns = 0;    ///< the round trip it was measured over: |error| <= rtt / 2
};

class session;

/// An active tf.device block; leaving it (destruction or reset()) pops it.
class device_scope {
public:
  device_scope(device_scope&& other) noexcept : owner_(other.owner_) { other.owner_ = nullptr; }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  device_scope& operator=(device_scope&&) = delete;
  ~device_scope() { reset(); }
  void reset();

private:
  friend class session;
  explicit device_scope(session* owner) : owner_(owner) {}
  session* owner_;
};

class session : public op_builder<session> {
public:
  /// `target` is the task this session belongs to ("/job:worker/task:1").
  static caf::expected<session> make(caf::actor_system& sys, cluster_spec spec,
                                     const std::string& target, session_options opts = {});

  session(session&&) noexcept;
  session& operator=(session&&) noexcept;
  ~session();

  const cluster_spec& cluster() const;

  /// "/job:J/replica:0/task:T".
  std::string target() const;

  /// Opens a device scope (merged into the enclosing one).
  caf::expected<device_scope> device(const std::string& name);

  /// The merged device of the current scopes ("" if none).
  std::string current_device() const;

  // -- graph building -------------------------------------------------------

  /// Gets or creates variable `name` on the placed node (tf.get_variable).
  caf::expected<output> variable(const std::string& name, shape_type shape,
                                 initializer init = initializer::zeros(),
                                 dtype type = dtype::float32);

  output constant(tensor value, const std::string& name = "Const") {
    return builder().constant(std::move(value), name);
  }

  /// A value given at run time (tf.placeholder); run() takes it in its feeds.
  output placeholder(const std::string& name = "Placeholder") { return builder().placeholder(name); }

  /// Any op of the registry by name (kernels/op_registry.hpp), e.g.
  /// op("relu", {x}); the typed methods (add, matmul, reduce_sum, ...) come
  /// from op_builder (graph/op_builder.hpp), as af::graph's do.
  output op(const std::string& kind, std::vector<output> inputs, op_attrs attrs = {},
            const std::string& name = "") {
    return builder().op(kind, std::move(inputs), attrs, name);
  }

  /// Reverse-mode gradients of the scalar `loss` with respect to `xs`
  /// (tf.gradients). The backward ops are added to the graph, each on the
  /// device of its forward op. An x that `loss` does not depend on is an error
  /// naming it; so is an op on the path that has no gradient.
  caf::expected<std::vector<output>> gradients(output loss, const std::vector<output>& xs);
  output assign(output var, output value, const std::string& name = "") {
    return builder().assign(var, value, name);
  }
  output assign_add(output var, output value, const std::string& name = "") {
    return builder().assign_add(var, value, name);
  }
  output assign_sub(output var, output value, const std::string& name = "") {
    return builder().assign_sub(var, value, name);
  }
  /// tf.scatter_add / _sub / _update of the variable's rows (graph/graph.hpp).
  output scatter_add(output var, output indices, output updates, const std::string& name = "") {
    return builder().scatter_add(var, indices, updates, name);
  }
  output scatter_sub(output var, output indices, output updates, const std::string& name = "") {
    return builder().scatter_sub(var, indices, updates, name);
  }
  output scatter_update(output var, output indices, output updates, const std::string& name = "") {
    return builder().scatter_update(var, indices, updates, name);
  }

  /// The graph's op names, in creation order (graph.get_operations()).
  std::vector<std::string> operations() const;

  // -- running --------------------------------------------------------------

  caf::expected<std::vector<tensor>> run(const std::vector<output>& fetches,
                                         run_trace* trace = nullptr);
  caf::expected<tensor> run(output fetch, run_trace* trace = nullptr);

  /// With values for placeholders (TF's feed_dict).
  caf::expected<std::vector<tensor>> run(const std::vector<output>& fetches,
                                         const std::vector<std::pair<output, tensor>>& feeds,
                                         run_trace* trace = nullptr);

  /// Runs `targets` for their effect and fetches nothing (TF's target ops):
  /// an assign of a large tensor does not send the value back.
  caf::error run_targets(const std::vector<output>& targets, run_trace* trace = nullptr);
  /// With values for placeholders: a training step fed its batch or its
  /// learning rate sends no updated value back either.
  caf::error run_targets(const std::vector<output>& targets,
                         const std::vector<std::pair<output, tensor>>& feeds,
                         run_trace* trace = nullptr);

  /// Runs the initializers of `vars` (all of this session's variables if
  /// empty), like global_variables_initializer. `run_id` names this run, so
  /// that wait_initialized(…, run_id) of other clients waits for this run's
  /// values and not for those an earlier run left on the nodes. A variable
  /// that its restarted node lost is created again first. Every variable's
  /// initializer is asked for at once (on its own node: the nodes fill
  /// their shards in parallel), each answer waited for up to `timeout` (0:
  /// the session's timeout; a large table's may need more).
  caf::error initialize(const std::vector<output>& vars = {}, const std::string& run_id = "",
                        std::chrono::milliseconds timeout = {});

  /// Names of the variables that have no value yet (report_uninitialized_variables).
  caf::expected<std::vector<std::string>> uninitialized(const std::vector<output>& vars = {});

  /// Waits until every variable has a value (set by run `run_id` if not
  /// empty). Gives up after `timeout` with an af_error::timeout that names
  /// each variable still missing; the variables drop the wait then too.
  /// With a cancel flag (session_options::cancel), its setting ends the
  /// wait within 20 ms with af_error::cancelled (Python's Ctrl-C).
  caf::error wait_initialized(std::chrono::milliseconds timeout,
                              const std::vector<output>& vars = {},
                              const std::string& run_id = "");

  // -- cluster --------------------------------------------------------------

  /// Asks /job:J/task:T for its info now (connecting first if needed): an
  /// error if it does not answer within the timeout.
  caf::expected<node_info> ping(const std::string& job, int32_t task);

  /// The same, waiting `timeout` (named in its timeout error) instead of the
  /// session's timeout (connecting still has connect_timeout). A ping sent
  /// just as the node died may go to its proxy, which CAF never answers: a
  /// poll for a node's return waits a little for each.
  caf::expected<node_info> ping(const std::string& job, int32_t task,
                                std::chrono::milliseconds timeout);

  /// How this session's variable ops to /job:J/task:T travel now (connecting
  /// first if needed): "shared memory", "tcp", "tls" or "ucx" (the data
  /// plane), or "CAF messages (...)" with why (the node runs in this process,
  /// it has no data plane, the session turned the data plane off, or the
  /// data plane could not be reached). `ping` in the REPL shows it.
  caf::expected<std::string> data_transport(const std::string& job, int32_t task);

  /// Waits until /job:J/task:T answers (it may still be starting), trying
  /// again every 50 ms; after `timeout` returns the last error, which names
  /// the task and its address ("waiting for cluster connection").
  caf::error wait_for_node(const std::string& job, int32_t task, std::chrono::milliseconds timeout);
  caf::expected<std::vector<variable_info>> list_variables(const std::string& job, int32_t task);

  /// Asks node /job:J/task:T to shut down.
  caf::error shutdown(const std::string& job, int32_t task);

  /// The full device a variable lives on (after soft placement).
  std::string device_of(output var) const;

  /// How many subgraphs this session registered with executors (one per
  /// distinct set of fetches or targets).
  size_t registered_graphs() const;

  /// The variable's actor, for talking to it directly (benchmarks, tools).
  variable_actor handle_of(output var) const;

  /// The graph this session builds (graph/graph.hpp).
  const graph& graph_def() const;

  /// Cuts, places and binds the step that computes `fetches` (or, with
  /// `want_values` false, runs them as targets) without running it: what a
  /// worker actor runs through its own step_runner.
  caf::expected<std::shared_ptr<prepared_step>> prepare(const std::vector<output>& fetches,
                                                        bool want_values = true);

  /// The aggregator `spec.name` on /job:J/task:T, created there if it has
  /// none (messages/aggregator.hpp): the variables must exist on that node.
  caf::expected<aggregator_actor> aggregator(const std::string& job, int32_t task,
                                             const aggregator_spec& spec);

  /// The rendezvous store of /job:J/task:T (messages/kv_store.hpp).
  caf::expected<kv_store_actor> kv_store(const std::string& job, int32_t task);

  /// The node actor of /job:J/task:T (messages/node.hpp), connecting first
  /// if needed: for requests the session has no method of its own for (a
  /// table shard's save or restore), sent by the caller's own actor.
  caf::expected<node_actor> node(const std::string& job, int32_t task);

  /// The actor system the session runs in.
  caf::actor_system& system() const;

  /// The clock estimate of /job:J/task:T, measured when the session connected.
  caf::expected<clock_estimate> clock_of(const std::string& job, int32_t task);

  /// (graphs, steps) the executor of `device` ("CPU:0") of /job:J/task:T holds now.
  caf::expected<std::pair<uint64_t, uint64_t>> executor_load(const std::string& job, int32_t task,
                                                             const std::string& device = "CPU:0");

  /// The graph the builder calls above add to (graph_def(), writable): for
  /// code that builds with graph/ directly (train/model.hpp).
  graph& builder();

private:
  friend class device_scope;
  struct impl;
  explicit session(std::unique_ptr<impl> ptr);
  std::unique_ptr<impl> impl_;
};

} // namespace af
