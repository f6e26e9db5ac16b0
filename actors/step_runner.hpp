#pragma once
/// The asynchronous step runner: registers a step's partitions with their
/// executors once, then runs "step N" with feeds, gathers the fetches, aborts
/// every partition at the first failure and assembles the trace, all with
/// request(...).then(...) from inside an event-based actor. Nothing blocks:
/// a worker actor runs its training steps through one of these without a
/// thread of its own. af::session is a blocking facade over it.
///
///   // in an event-based actor that owns `runner`:
///   self->set_down_handler([&](caf::down_msg& dm) { runner.on_down(self, dm); });
///   runner.run(self, step, feeds, /*trace*/ false, [=](caf::expected<step_outputs> out) {...});
///
/// The runner monitors every executor it registers with: when one dies (its
/// node was killed, or stopped and missed its heartbeats), each step running on
/// it fails at once with peer_down naming the device and node, and the other
/// partitions are told to abort. Registration is under a graph id the runner
/// draws at random; an executor that already holds that id for another owner
/// refuses it and the runner draws again, so ids never collide.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "caf/actor_addr.hpp"
#include "caf/event_based_actor.hpp"
#include "caf/expected.hpp"
#include "caf/system_messages.hpp"

#include "actors/trace.hpp"
#include "messages/executor.hpp"

namespace af {

/// One partition of a prepared step: where it runs and what registers it.
struct prepared_partition {
  executor_actor exec;
  std::string device;           ///< full device name
  std::string node;             ///< host:port of its node
  std::string task;             ///< /job:J/task:T of its node
  std::string note;             ///< soft placement, if it moved the partition
  int64_t clock_offset_ns = 0;  ///< the node's steady clock minus the client's
  partition part;               ///< the registration (part.graph is set by the runner)
  std::vector<int32_t> feeds;   ///< placeholders it reads
};

/// What a trace shows of one graph node of the step.
struct trace_node {
  std::string name;
  std::string op;        ///< kernel op or update kind; "variable" for variables
  std::string requested;
  std::string device;    ///< variables: where they live
  std::string node;      ///< variables: host:port of their node
  std::string note;      ///< variables: soft placement
};

/// A step cut, placed and bound to executors: made once per set of fetches
/// (af::session::prepare), then run any number of times, by any number of
/// runners. Immutable once made: each runner keeps its own registration (graph
/// id, owner) of it.
struct prepared_step {
  std::vector<prepared_partition> partitions;
  std::map<int32_t, size_t> partition_of; ///< compute/update node -> partition
  std::map<int32_t, trace_node> nodes;    ///< every node the step touches
  std::set<std::string> tasks;            ///< the nodes (/job:J/task:T) it runs on or reads from
  /// The executors' deadline for one step. The runner waits a little longer
  /// (`reply_timeout()`), so that an executor's timeout, which names what it
  /// waited for, arrives before the runner's own.
  std::chrono::milliseconds timeout{10000};

  /// The deadline plus the executors' sweep interval (at most a quarter of
  /// it, at most 1 s) plus a round trip's worth.
  std::chrono::milliseconds reply_timeout() const {
    return timeout + std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::seconds(1))
           + std::chrono::milliseconds(250);
  }
};

struct step_outputs {
  std::map<int32_t, tensor> values; ///< fetched node -> value
  std::vector<trace_entry> trace;   ///< when asked for
};

class step_runner {
public:
  using callback = std::function<void(caf::expected<step_outputs>)>;

  step_runner();

  /// Runs `step` once with `feeds` (placeholder node -> value). `done` is
  /// called exactly once, on `self`'s thread.
  void run(caf::event_based_actor* self, std::shared_ptr<prepared_step> step,
           std::map<int32_t, tensor> feeds, bool want_trace, callback done);

  /// Call from the owner's down handler.
  void on_down(caf::event_based_actor* self, const caf::down_msg& dm);

  /// Tells the executors to drop this runner's registration of `step` (a
  /// session that is done with it). Steps of it in flight are aborted.
  void forget(caf::event_based_actor* self, const std::shared_ptr<prepared_step>& step);

  /// Steps in flight now.
  size_t running() const { return running_.size(); }

  /// Prepared steps registered (or registering) by this runner.
  size_t registered() const { return regs_.size(); }

  /// Where graph ids come from (random by default); tests force collisions.
  std::function<uint64_t()> next_graph_id;

private:
  struct pending_run {
    std::map<int32_t, tensor> feeds;
    bool want_trace = false;
    callback done;
    int attempt = 0;
  };

  /// This runner's registration of one prepared step.
  struct registration {
    std::shared_ptr<prepared_step> step; ///< keeps the key alive
    uint64_t graph = 0;
    bool ready = false;
    std::vector<pending_run> waiting; ///< runs that arrived while it registered
  };

  struct in_flight {
    std::shared_ptr<prepared_step> step;
    uint64_t graph = 0;
    uint64_t id = 0;
    pending_run origin; ///< to run again once if the executor lost the graph
    size_t missing = 0;
    std::vector<step_result> results;
    caf::error aborted; ///< an "aborted" reply: the cause comes from elsewhere
    size_t lost = 0;         ///< partitions whose executor no longer held the graph
    caf::error first_lost;   ///< the first such answer
  };

  void start(caf::event_based_actor* self, std::shared_ptr<prepared_step> step, pending_run run);
  void register_step(caf::event_based_actor* self, const std::shared_ptr<prepared_step>& step,
                     int attempts_left);
  void dispatch(caf::event_based_actor* self, std::shared_ptr<prepared_step> step, uint64_t graph,
                pending_run run);
  void finish(caf::event_based_actor* self, uint64_t id, caf::error err);
  bool id_in_use(uint64_t id) const;
  static step_outputs assemble(const prepared_step& step, std::vector<step_result>& results,
                               bool want_trace);

  std::map<uint64_t, in_flight> running_;
  std::map<const prepared_step*, registration> regs_;
  std::set<caf::actor_addr> monitored_;
  uint64_t next_step_ = 1;
  std::mt19937_64 ids_;
};

} // namespace af
