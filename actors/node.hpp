#pragma once
/// The node actor's implementation (interface: messages/node.hpp) and the one
/// function that brings a node up, shared by actorflow-node and the embedded
/// cluster.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/expected.hpp"

#include "caf/actor_addr.hpp"

#include "net/data_plane.hpp"
#include "actors/variable.hpp"
#include "actors/variable_directory.hpp"
#include "config/cluster_spec.hpp"
#include "messages/node.hpp"

namespace af {

/// What a node spawns when asked for an aggregator. The aggregators live in
/// the training layer (dist/aggregator.hpp: node_aggregators()), above this
/// one, so whoever starts a node hands them in; a node started without them
/// answers an aggregator request with an error that says so.
struct aggregator_services {
  /// Spawns the aggregator `spec.mode` names over `vars` (spec.variables' cells),
  /// admitting its members' tokens into `gate` and setting its data-plane
  /// paths into `paths` (both its data-plane entry's).
  std::function<caf::expected<aggregator_actor>(
    caf::actor_system&, aggregator_spec, std::vector<variable_directory::entry>,
    std::shared_ptr<push_gate>, std::shared_ptr<plane_push_paths>)>
    spawn;
  /// How `want` differs from `have` in what changes updates ("" if it does not).
  std::function<std::string(const aggregator_spec& have, const aggregator_spec& want)> difference;
};

/// What a node reads for node_info::clock_ns (the clock offsets sessions
/// estimate): its steady clock in nanoseconds when null. Only a caller of
/// start_node or node_impl passes another (a test that checks the estimate
/// against a known offset); no config or environment sets it.
using node_clock = int64_t (*)();

/// The node actor owns its variables' and executors' actors: they end with
/// it. Executors are linked, so one that fails takes the node down with its
/// reason. Variables are monitored, not linked (a link would carry a
/// variable's `kill` to the node): one whose actor ends is removed from the
/// registry and the data plane's directory, and the node serves on.
struct node_state {
  node_info info;
  std::string device_prefix;                       ///< /job:J/replica:0/task:T
  int32_t request_timeout_ms = 10000;              ///< its requests to its own actors
  int64_t max_variable_bytes = int64_t{2} << 30;   ///< [node] max_variable_bytes
  std::map<std::string, executor_actor> executors; ///< "CPU:0" -> executor
  struct entry {
    variable_spec spec;
    variable_cell_actor actor;
  };
  std::map<std::string, entry> variables;
  /// Variable actor -> name, for down messages; shared with the functor that
  /// stops the variables when the node ends.
  std::shared_ptr<std::map<caf::actor_addr, std::string>> variable_names;
  std::shared_ptr<variable_directory> directory; ///< shared with the data plane
  struct aggregator_entry {
    aggregator_spec spec;
    aggregator_actor actor;
  };
  std::map<std::string, aggregator_entry> aggregators;
  /// Stopped with the node (shared with the functor that stops them).
  std::shared_ptr<std::vector<caf::actor_addr>> owned;
  kv_store_actor kv;
  aggregator_services aggregator_kinds; ///< from start_node
  node_clock clock = nullptr;           ///< for ping's clock_ns; null: the steady clock

  /// Checks a get-or-create request against the registry: an existing entry
  /// with the same dtype and shape, nullptr if new, or the mismatch error.
  caf::expected<const entry*> find_compatible(const variable_spec& spec) const;
};

node_actor::behavior_type node_impl(node_actor::stateful_pointer<node_state> self,
                                    std::string job, int32_t task, node_options opts,
                                    std::shared_ptr<variable_directory> directory,
                                    uint16_t data_port, aggregator_services aggregators,
                                    node_clock clock);

/// A node that is up: its actor, the port it listens on and its data plane.
/// Stop the data plane (or destroy this) before the actor system goes away.
struct running_node {
  node_actor actor;
  uint16_t port = 0;
  std::string address; ///< host:port as published
  std::vector<std::string> devices;
  std::vector<std::string> device_errors; ///< devices that failed to come up ("GPU:1: why")
  std::shared_ptr<data_plane_server> data_plane;
  /// Its variables, aggregators and executors by name (shared with the data
  /// plane): whoever watches the node reads them (metrics/node_metrics.hpp).
  std::shared_ptr<variable_directory> directory;
  bool tls = false; ///< both ports are mutual TLS
};

/// Spawns the node actor for /job:`job`/task:`task` and publishes it, with a
/// data plane on `opts.data_port` and its timeouts.
/// `port` 0 asks the OS for a free one (embedded clusters). A port that is
/// taken gives af_error::bind_failed naming the address.
///
/// With `sec` enabled both ports are mutual TLS with the cluster CA (`sys`
/// must come from a system_config made with the same `sec`); its files are
/// checked first (check_security). Without it the node refuses an address
/// that is not loopback (af_error::invalid_config) unless `sec.insecure`.
/// Either way the CAF port closes a connection whose first message announces
/// more than opts.max_handshake_bytes (net/caf_port.hpp).
///
/// `aggregators` is what the node spawns for an aggregator request: pass
/// dist's node_aggregators() for a node that hosts training (actorflow-node,
/// actorflow-train and the embedded cluster do). `clock`: see node_clock.
caf::expected<running_node> start_node(caf::actor_system& sys, const std::string& job,
                                       int32_t task, const std::string& bind_host,
                                       uint16_t port, const node_options& opts,
                                       const security_options& sec = {},
                                       aggregator_services aggregators = {},
                                       node_clock clock = nullptr);

/// True when `host` names only loopback addresses ("localhost", 127.0.0.0/8,
/// ::1, or a name that resolves to nothing else). "" (every address) and
/// "0.0.0.0" are not.
bool is_loopback_host(const std::string& host);

/// Nodes living in this process, so that a session in the same actor system
/// talks to its node directly (no sockets, no copies).
void register_local_node(const std::string& address, caf::actor_system* sys, node_actor node);
void unregister_local_node(const std::string& address);
node_actor find_local_node(const std::string& address, caf::actor_system* sys);

} // namespace af
