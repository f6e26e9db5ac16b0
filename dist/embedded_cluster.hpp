#pragma once
/// Several nodes inside one process, each in its own actor system, published on
/// free loopback ports (TF's create_local_cluster / create_local_server).
/// Sessions made from a node's system talk to that node directly and to the
/// others over real TCP, exactly as separate processes would.
///
/// Destroy every session before the cluster: a session lives in a node's
/// actor system. A session may be made and used on any thread (a client's,
/// Python's) while another thread ends the cluster.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/error.hpp"
#include "caf/expected.hpp"

#include "net/data_plane.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "config/cluster_spec.hpp"

namespace af {

struct running_node;       // actors/node.hpp (not included: its names would crowd every includer)
class variable_directory;  // actors/variable_directory.hpp

class embedded_cluster {
public:
  /// `jobs`: job name -> number of tasks, e.g. {{"ps", 1}, {"worker", 2}}.
  static caf::expected<std::unique_ptr<embedded_cluster>>
  start(const std::map<std::string, int>& jobs, node_options opts = defaults());

  /// Two scheduler threads per node, sharing policy, one CPU device.
  static node_options defaults();

  /// shutdown(default_shutdown_timeout), its error logged.
  ~embedded_cluster();

  /// How long shutdown() waits, by default, for each node's actor system.
  static constexpr std::chrono::milliseconds default_shutdown_timeout{60000};

  /// Stops every node and ends their actor systems, each system's end
  /// bounded by `timeout` (CAF waits without a bound for a system's actors,
  /// and for each thread that last spawned an actor in it, to let go). A
  /// system that does not end in time is left to end in the background,
  /// named in the error (timeout). The cluster has no nodes afterwards;
  /// calling it again does nothing.
  caf::error shutdown(std::chrono::milliseconds timeout = default_shutdown_timeout);

  const cluster_spec& spec() const { return spec_; }

  /// The actor system of /job:J/task:T (TF's server.target).
  caf::actor_system& system(const std::string& job, int32_t task);

  /// A session belonging to /job:J/task:T, running in that node's system
  /// (af_error::unreachable after shutdown()).
  caf::expected<session> session_for(const std::string& job, int32_t task,
                                     session_options opts = {});

  /// /job:J/task:T's node as started (its actor, port, data plane and
  /// directory), for whoever watches it (metrics/node_metrics.hpp); throws
  /// std::out_of_range if the cluster has no such task.
  running_node node(const std::string& job, int32_t task);

private:
  struct member {
    std::string job;
    int32_t task = 0;
    std::unique_ptr<system_config> cfg;
    std::unique_ptr<caf::actor_system> sys;
    node_actor node;
    std::shared_ptr<data_plane_server> data_plane;
    std::shared_ptr<variable_directory> directory;
    uint16_t port = 0;
    std::string address;
  };
  embedded_cluster() = default;
  member* find(const std::string& job, int32_t task);
  std::vector<member> members_;
  cluster_spec spec_;
};

} // namespace af
