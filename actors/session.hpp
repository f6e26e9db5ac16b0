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
/// Running: the ops a step needs are cut into one partition per device; each
/// partition is registered with its device's executor once (per set of
/// fetches), and each step then only sends "run step N" with the feeds.
/// Values that cross partitions go executor to executor, never through the
/// client. Reading a variable, and updating one with a value the client has,
/// go straight to the variable (over the data plane when it is remote).
///
/// Every call that talks to the cluster is bounded by `session_options`'
/// timeouts and returns an error naming what it waited for. A session is used
/// by one thread at a time; it must be destroyed before its actor system.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/expected.hpp"

#include "config/cluster_spec.hpp"
#include "messages/device_name.hpp"
#include "messages/node.hpp"

namespace af {

struct session_options {
  std::chrono::milliseconds timeout{10000};        ///< any one request
  std::chrono::milliseconds connect_timeout{5000}; ///< connecting to a node
  bool soft_placement = true;
  /// Variable ops on other processes' nodes go over the node's tensor data
  /// plane (actors/data_plane.hpp); false sends them as CAF messages.
  bool data_plane = true;
  /// How long to poll for a data-plane reply before sleeping (0: never).
  /// Polling trades a little CPU of the waiting thread for round trips.
  std::chrono::microseconds reply_poll{50};
};

/// Where one op or variable access of a run went.
struct trace_entry {
  std::string op;        ///< graph name: "w", "add", "var/assign_add"
  std::string kind;      ///< the op (add, matmul, ...), read, transfer, assign, assign_add, ...
  std::string requested; ///< the device as requested (scopes merged; may be partial)
  std::string device;    ///< the device it ran on, fully specified
  std::string node;      ///< host:port of the node
  std::string note;      ///< e.g. why soft placement moved it
  int64_t start_ns = 0;  ///< steady clock (executor's for ops, client's for variable calls)
  int64_t end_ns = 0;
  uint64_t bytes_in = 0;  ///< ops: bytes of their inputs; transfers: bytes moved
  uint64_t bytes_out = 0; ///< ops: bytes of their result
};

struct run_trace {
  std::vector<trace_entry> entries;

  /// TF's run_with_location_trace printout: each device, then its ops.
  std::string by_device() const;

  /// One line per entry: op -> requested -> actual device @ node (note).
  std::string to_string() const;

  /// The entry of graph op `op`, or nullptr.
  const trace_entry* find(const std::string& op) const;

  /// Chrome trace-event JSON (open in Perfetto or chrome://tracing): one
  /// process per node, one thread per device, a span per entry; variables
  /// read from another node appear as "transfer" spans.
  std::string to_chrome_json() const;
};

/// A node of the session's graph (TF's Tensor / Operation handle).
struct output {
  int32_t id = -1;
  bool valid() const { return id >= 0; }
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

class session {
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

  output constant(tensor value, const std::string& name = "Const");

  /// A value given at run time (tf.placeholder); run() takes it in its feeds.
  output placeholder(const std::string& name = "Placeholder");

  /// Any kernel op by name (kernels::run_op), e.g. op("relu", {x}).
  output op(const std::string& kind, std::vector<output> inputs, op_attrs attrs = {},
            const std::string& name = "");

  output add(output a, output b, const std::string& name = "add");
  output sub(output a, output b, const std::string& name = "sub");
  output mul(output a, output b, const std::string& name = "mul");
  output div(output a, output b, const std::string& name = "div");
  output neg(output x) { return op("neg", {x}); }
  output exp(output x) { return op("exp", {x}); }
  output log(output x) { return op("log", {x}); }
  output relu(output x) { return op("relu", {x}); }
  output sigmoid(output x) { return op("sigmoid", {x}); }
  output tanh(output x) { return op("tanh", {x}); }
  output square(output x) { return op("square", {x}); }
  output sqrt(output x) { return op("sqrt", {x}); }
  output matmul(output a, output b, bool transpose_a = false, bool transpose_b = false,
                const std::string& name = "matmul");
  /// Reductions over all axes, or over `axis` when given (negative: from the end).
  output reduce_sum(output x, std::optional<int32_t> axis = std::nullopt, bool keep_dims = false);
  output reduce_mean(output x, std::optional<int32_t> axis = std::nullopt, bool keep_dims = false);
  output reduce_max(output x, std::optional<int32_t> axis = std::nullopt, bool keep_dims = false);
  output softmax(output logits) { return op("softmax", {logits}); }
  output log_softmax(output logits) { return op("log_softmax", {logits}); }
  /// Per-example loss of logits [batch, classes] and int labels [batch].
  output softmax_xent(output logits, output labels, const std::string& name = "softmax_xent");

  /// Reverse-mode gradients of the scalar `loss` with respect to `xs`
  /// (tf.gradients). The backward ops are added to the graph, each on the
  /// device of its forward op. An x that `loss` does not depend on is an error
  /// naming it; so is an op on the path that has no gradient.
  caf::expected<std::vector<output>> gradients(output loss, const std::vector<output>& xs);
  output assign(output var, output value, const std::string& name = "");
  output assign_add(output var, output value, const std::string& name = "");
  output assign_sub(output var, output value, const std::string& name = "");

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

  /// Runs the initializers of `vars` (all of this session's variables if
  /// empty), like global_variables_initializer.
  caf::error initialize(const std::vector<output>& vars = {});

  /// Names of the variables that have no value yet (report_uninitialized_variables).
  caf::expected<std::vector<std::string>> uninitialized(const std::vector<output>& vars = {});

  /// Waits until every variable has a value. Gives up after `timeout` with an
  /// af_error::timeout that names each variable still missing.
  caf::error wait_initialized(std::chrono::milliseconds timeout,
                              const std::vector<output>& vars = {});

  // -- cluster --------------------------------------------------------------

  caf::expected<node_info> ping(const std::string& job, int32_t task);

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

private:
  friend class device_scope;
  struct impl;
  explicit session(std::unique_ptr<impl> ptr);
  std::unique_ptr<impl> impl_;
};

} // namespace af
