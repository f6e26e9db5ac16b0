#pragma once
/// The node actor's implementation (interface: messages/node.hpp) and the one
/// function that brings a node up, shared by actorflow-node and the embedded
/// cluster.

#include <map>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/expected.hpp"

#include "actors/data_plane.hpp"
#include "config/cluster_spec.hpp"
#include "messages/node.hpp"

namespace af {

struct node_state {
  node_info info;
  std::string device_prefix;                       ///< /job:J/replica:0/task:T
  std::map<std::string, executor_actor> executors; ///< "CPU:0" -> executor
  struct entry {
    variable_spec spec;
    variable_actor actor;
  };
  std::map<std::string, entry> variables;
  std::shared_ptr<variable_directory> directory; ///< shared with the data plane

  /// Checks a get-or-create request against the registry: an existing entry
  /// with the same dtype and shape, nullptr if new, or the mismatch error.
  caf::expected<const entry*> find_compatible(const variable_spec& spec) const;
};

node_actor::behavior_type node_impl(node_actor::stateful_pointer<node_state> self,
                                    std::string job, int32_t task, node_options opts,
                                    std::shared_ptr<variable_directory> directory,
                                    uint16_t data_port);

/// A node that is up: its actor, the port it listens on and its data plane.
/// Stop the data plane (or destroy this) before the actor system goes away.
struct running_node {
  node_actor actor;
  uint16_t port = 0;
  std::string address; ///< host:port as published
  std::vector<std::string> devices;
  std::shared_ptr<data_plane_server> data_plane;
};

/// Spawns the node actor for /job:`job`/task:`task` and publishes it.
/// `port` 0 asks the OS for a free one (embedded clusters). A port that is
/// taken gives af_error::bind_failed naming the address.
caf::expected<running_node> start_node(caf::actor_system& sys, const std::string& job,
                                       int32_t task, const std::string& bind_host,
                                       uint16_t port, const node_options& opts);

/// Nodes living in this process, so that a session in the same actor system
/// talks to its node directly (no sockets, no copies).
void register_local_node(const std::string& address, caf::actor_system* sys, node_actor node);
void unregister_local_node(const std::string& address);
node_actor find_local_node(const std::string& address, caf::actor_system* sys);

} // namespace af
