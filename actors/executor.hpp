#pragma once
/// Executor actors (interface: messages/executor.hpp): one per device of a node.

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "caf/actor_addr.hpp"
#include "caf/actor_system.hpp"
#include "caf/typed_response_promise.hpp"

#include "actors/edge_budget.hpp"
#include "actors/node_watch.hpp"
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
    /// The ops whose values come from other partitions (op_input::remote):
    /// an edge for any other op is dropped.
    std::unordered_set<int32_t> remote_inputs;
    uint64_t newest_step = 0;       ///< of its run_steps (edges for older unopened steps are stale)
    bool warned_duplicate = false;  ///< a second value for an op was logged (once per graph)
  };
  std::unordered_map<uint64_t, registered> graphs;
  /// A detached helper that talks to one other node's data plane.
  struct data_link {
    caf::actor actor;
    std::shared_ptr<std::atomic<bool>> cancel; ///< set: its wait gives up (cancelled)
    int in_flight = 0;                         ///< requests it has not answered
    int64_t last_used_ns = 0;                  ///< steady clock
  };
  /// Read other nodes' variables over their data plane, one per node
  /// ("/job:J/task:T at host:port"); edge senders likewise send values to
  /// other nodes' executors (detached: the executor never blocks on a
  /// socket). A helper is stopped and dropped when a request to it fails
  /// with none other in flight, when a peer of a graph on that node dies,
  /// and when it was idle for a minute as another is made; a fresh one is
  /// made for the next request.
  std::map<std::string, data_link> remote_readers;
  std::map<std::string, data_link> edge_senders;
  /// The cancel flags of all helpers: set when the executor exits, so that
  /// none stays blocked on a socket after it.
  std::shared_ptr<std::vector<std::shared_ptr<std::atomic<bool>>>> link_cancels;

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
    std::vector<std::string> sending; ///< those values: "op 'x' to DEVICE on the data plane at h:p"
    std::unordered_map<std::string, tensor> var_reads; ///< each variable read once a step
    caf::typed_response_promise<step_result> rp;
    step_result result;
    int64_t early_bytes = 0; ///< of edges held before run_step, counted in edge_bytes
    int64_t run_ns = 0;      ///< steady clock at its run_step, for step_latency
  };
  std::map<std::pair<uint64_t, uint64_t>, step> steps;
  bool sweeping = false; ///< a sweep message is scheduled

  /// Edge bytes held and not yet taken by a running step (actors/edge_budget.hpp).
  std::shared_ptr<std::atomic<int64_t>> edge_bytes;
  /// Its steps' latencies, run_step to reply (actors/node_watch.hpp: the metrics read them).
  std::shared_ptr<latency_histogram> step_latency;
  refusal_log edge_refusals; ///< the log of dropped edges: the first, then a count every 10 s

  /// Recently finished or aborted steps: late edges for them are dropped.
  std::set<std::pair<uint64_t, uint64_t>> done;
  std::deque<std::pair<uint64_t, uint64_t>> done_order;
};

/// Edge senders and remote readers alive in this process (tests).
size_t live_edge_senders();
size_t live_remote_readers();

executor_actor::behavior_type executor_impl(executor_actor::stateful_pointer<executor_state> self,
                                            std::string device,
                                            std::shared_ptr<kernels::backend> backend,
                                            std::shared_ptr<kernels::backend> fallback);

} // namespace af
