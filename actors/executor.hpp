#pragma once
/// Executor actors (interface: messages/executor.hpp): one per device of a node.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "caf/actor_addr.hpp"
#include "caf/actor_system.hpp"
#include "caf/typed_response_promise.hpp"

#include "kernels/kernels.hpp"
#include "messages/executor.hpp"

namespace af {

struct executor_state {
  std::string device;                         ///< full device name
  std::shared_ptr<kernels::backend> backend;  ///< CPU or CUDA
  std::shared_ptr<kernels::backend> fallback; ///< the node's CPU, for ops a GPU lacks

  struct registered {
    partition part;
    caf::actor_addr owner; ///< who registered it; its death drops the graph
  };
  std::unordered_map<uint64_t, registered> graphs;
  /// Read other nodes' variables over their data plane, one per node address.
  std::map<std::string, caf::actor> remote_readers;
  /// Send values to other nodes' executors over their data plane, one per
  /// node address (detached: the executor never blocks on a socket).
  std::map<std::string, caf::actor> edge_senders;

  /// One step of one graph, from its first edge or run_step to its reply.
  struct step {
    const partition* part = nullptr; ///< set by run_step
    size_t next = 0;                 ///< the next op to run
    bool waiting = false;            ///< a variable request is in flight
    int64_t deadline_ns = 0;         ///< steady clock; the sweep fails it after
    std::string waiting_for;         ///< what it waits on now, for the timeout's text
    std::unordered_map<int32_t, tensor> values;        ///< results, edges, feeds
    struct arrival {
      int64_t sent_ns = 0;
      int64_t received_ns = 0;
      std::string path; ///< how it came (the edge message says)
    };
    std::unordered_map<int32_t, arrival> arrivals; ///< by the edge's producing op
    int pending_sends = 0; ///< values on their way to other nodes' data planes, not yet taken
    std::unordered_map<std::string, tensor> var_reads; ///< each variable read once a step
    caf::typed_response_promise<step_result> rp;
    step_result result;
  };
  std::map<std::pair<uint64_t, uint64_t>, step> steps;
  bool sweeping = false; ///< a sweep message is scheduled

  /// Recently finished or aborted steps: late edges for them are dropped.
  std::set<std::pair<uint64_t, uint64_t>> done;
  std::deque<std::pair<uint64_t, uint64_t>> done_order;
};

executor_actor::behavior_type executor_impl(executor_actor::stateful_pointer<executor_state> self,
                                            std::string device,
                                            std::shared_ptr<kernels::backend> backend,
                                            std::shared_ptr<kernels::backend> fallback);

} // namespace af
