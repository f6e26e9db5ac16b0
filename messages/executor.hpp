#pragma once
/// The executor actor: one per device of a node; runs a graph's partitions.
///
/// Protocol (a step runner, actors/step_runner.hpp, drives it; graphs are
/// registered once, then run per step):
///   (register, partition) -> (ok)
///        keeps the partition under partition.graph for its sender, the
///        owner, whom it monitors: when the owner dies (its process is killed,
///        or its session ends) every graph and step of that owner is dropped.
///        It also monitors the partition's peers (the other executors of the
///        graph): when one dies, each running step of the graph fails at once
///        with peer_down naming that executor's device. A graph id already held
///        for another owner is invalid_argument (the owner picks another id).
///   (run_step, uint64 graph, uint64 step, vector<feed>) -> (step_result)
///        runs the partition's ops in order. A value another partition needs
///        is sent there as (edge, graph, step, op, tensor, sent_ns, path, token),
///        executor to executor, never through the client: on the same node as
///        a local message; to another node's executor on that node's data
///        plane (an edge frame, core/wire_format.hpp, sent by a detached sender
///        per destination node, which stops after a failed send, the death of
///        a peer on that node, or a minute unused, and gives up at once when
///        the executor exits; its node's server delivers the edge message) when
///        the partition names the consumer's data plane, else as a CAF
///        message. A step with values in flight on the data plane answers
///        once the consumers' nodes took them; a send that fails fails the
///        step, naming the edge, the destination and the cause (the session
///        then aborts the other partitions). Values from elsewhere wait in
///        an inbox until their op needs them. Every step, and every inbox
///        opened by an early edge, has the partition's deadline: a step still
///        waiting then fails with a timeout that names what it waits for, and
///        nothing is kept. The reply carries the fetched values, each op's
///        timing and each transfer into this partition as measured here.
///   (edge, uint64 graph, uint64 step, int32 op, tensor, int64 sent_ns, string path,
///    string token)                                          one-way
///        `path`: how it came, for the trace ("local buffer", "CAF message
///        from ...", "data plane (tcp|tls|shared memory|ucx (...)) from host:port");
///        `token`: the graph's edge_token. A value with a wrong or missing
///        token is dropped and logged with `path` (the sender's address),
///        before it takes its op's place in the step.
///   (abort, uint64 graph, uint64 step)                      one-way: drop the step
///   (forget, uint64 graph)                                  one-way: drop the graph
///   (info)  -> (uint64 graphs, uint64 steps)                what it holds now (tests)
///   (sweep)                                                 to itself: fail steps past their deadline
/// Errors name the op: shape_mismatch / dtype_mismatch with both shapes,
/// uninitialized naming the variable, invalid_argument for an unknown op,
/// resource_exhausted when memory ran out, not_found for a graph that was
/// never registered (or was dropped).
#include <cstdint>
#include <string>
#include <vector>

#include "caf/meta/type_name.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "core/op_attrs.hpp"
#include "messages/variable.hpp"

namespace af {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, op_attrs& x) {
  return f(caf::meta::type_name("op_attrs"), x.transpose_a, x.transpose_b, x.all_axes, x.axis,
           x.keep_dims);
}

/// Where an input of a partition's op comes from.
struct op_input {
  enum kind_t : uint8_t { local = 0, variable = 1, constant = 2, feed = 3, remote = 4 };
  uint8_t kind = local;
  int32_t op = -1;      ///< local, remote, feed: the producing op's graph id
  variable_actor var;   ///< variable
  std::string var_name; ///< variable, for errors and traces
  tensor value;         ///< constant (shipped once, at registration)
  std::string data_plane; ///< variable on another node: "host:port" of that node's data plane
  std::string var_node;   ///< variable: "host:port" of the node that holds it (traces)
};

caf::error inspect(caf::serializer& f, op_input& x);
caf::error inspect(caf::deserializer& f, op_input& x);

template <class Inspector>
typename std::enable_if<!std::is_base_of<caf::serializer, Inspector>::value
                          && !std::is_base_of<caf::deserializer, Inspector>::value,
                        typename Inspector::result_type>::type
inspect(Inspector& f, op_input& x) {
  return f(caf::meta::type_name("op_input"), x.kind, x.op, x.var, x.var_name, x.value, x.data_plane,
           x.var_node);
}

/// One op of a partition. `op` is a kernels::run_op name, or assign /
/// assign_add / assign_sub (inputs: the variable, the value).
struct partition_op {
  int32_t id = -1;
  std::string op;
  std::string name;
  op_attrs attrs;
  std::vector<op_input> inputs;
  std::vector<caf::actor> consumers; ///< executors of other partitions that need the value
  bool fetch = false;                ///< send the value back to the client
  bool want_value = true;            ///< updates: read the value back
  /// Per consumer (same order; may be shorter: none): "host:port" of the
  /// data plane of its node when that is another node, else empty (a local
  /// or CAF message).
  std::vector<std::string> consumer_data_planes;
  std::vector<std::string> consumer_devices; ///< per consumer: its full device name
  /// Per consumer: "/job:J/task:T" of its node (with TLS, the certificate its
  /// data plane must show).
  std::vector<std::string> consumer_tasks;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, partition_op& x) {
  return f(caf::meta::type_name("partition_op"), x.id, x.op, x.name, x.attrs, x.inputs, x.consumers,
           x.consumer_data_planes, x.consumer_devices, x.consumer_tasks, x.fetch, x.want_value);
}

struct partition {
  uint64_t graph = 0;
  std::vector<partition_op> ops;    ///< in topological order
  std::vector<caf::actor> peers;    ///< the graph's other executors (monitored)
  std::vector<std::string> peer_devices; ///< their full devices, for errors
  uint32_t step_timeout_ms = 10000; ///< a step (or an early inbox) older than this fails
  uint32_t variable_timeout_ms = 10000; ///< one variable read or update
  /// The graph's secret (actors/edge_token.hpp): 16 random bytes, the same in
  /// every partition of the graph; each edge carries it, and an edge without
  /// it is refused. A partition without one is refused at registration.
  std::string edge_token;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, partition& x) {
  return f(caf::meta::type_name("partition"), x.graph, x.ops, x.peers, x.peer_devices,
           x.step_timeout_ms, x.variable_timeout_ms, x.edge_token);
}

struct feed {
  int32_t op = -1; ///< the placeholder's graph id
  tensor value;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, feed& x) {
  return f(caf::meta::type_name("feed"), x.op, x.value);
}

/// What one op of a step did, for the trace.
struct op_timing {
  int32_t op = -1;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  std::string note;
  uint64_t bytes_in = 0;  ///< of the op's inputs
  uint64_t bytes_out = 0; ///< of its result
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, op_timing& x) {
  return f(caf::meta::type_name("op_timing"), x.op, x.start_ns, x.end_ns, x.note, x.bytes_in,
           x.bytes_out);
}

/// One value that came into a partition during a step, as measured by the
/// executor that received it. Times are on the clock of the node that took
/// them: `start_ns` is the sender's (an edge's producer stamps it as it
/// sends) or, for a variable read, this executor's; `end_ns` is this
/// executor's. The step runner maps both onto the client's time line.
struct transfer_timing {
  uint8_t kind = 0;       ///< 0 = edge from another partition, 1 = variable read
  int32_t op = -1;        ///< edge: the producing op; variable: the variable's node id
  int32_t consumer = -1;  ///< the op of this partition that needed it first
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint64_t bytes = 0;     ///< the bytes that arrived
  std::string path;       ///< "local buffer", "data plane (tcp|tls|shared memory|ucx (...)) from host:port", "CAF message"
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, transfer_timing& x) {
  return f(caf::meta::type_name("transfer_timing"), x.kind, x.op, x.consumer, x.start_ns, x.end_ns,
           x.bytes, x.path);
}

struct step_result {
  std::string device;           ///< the executor's full device name
  std::vector<feed> fetched;    ///< (op id, value) of the fetched ops
  std::vector<op_timing> timings;
  std::vector<transfer_timing> transfers;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_result& x) {
  return f(caf::meta::type_name("step_result"), x.device, x.fetched, x.timings, x.transfers);
}

using executor_actor = caf::typed_actor<
  caf::replies_to<register_atom, partition>::with<caf::ok_atom>,
  caf::replies_to<run_step_atom, uint64_t, uint64_t, std::vector<feed>>::with<step_result>,
  caf::reacts_to<edge_atom, uint64_t, uint64_t, int32_t, tensor, int64_t, std::string, std::string>,
  caf::reacts_to<abort_atom, uint64_t, uint64_t>,
  caf::reacts_to<forget_atom, uint64_t>,
  caf::replies_to<info_atom>::with<uint64_t, uint64_t>,
  caf::reacts_to<sweep_atom>>;

} // namespace af
