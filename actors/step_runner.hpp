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
/// (af::session::prepare), then run any number of times.
struct prepared_step {
  std::vector<prepared_partition> partitions;
  std::map<int32_t, size_t> partition_of; ///< compute/update node -> partition
  std::map<int32_t, trace_node> nodes;    ///< every node the step touches
  std::set<std::string> tasks;            ///< the nodes (/job:J/task:T) it uses
  std::chrono::milliseconds timeout{10000}; ///< each request, and the executors' step deadline

  // -- the runner's bookkeeping
  uint64_t graph = 0;      ///< 0 until registered
  bool registered = false;
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

  /// Tells the executors to drop `step`'s graph (a session that is done with it).
  static void forget(const prepared_step& step);

  /// Steps in flight now.
  size_t running() const { return running_.size(); }

private:
  struct in_flight {
    std::shared_ptr<prepared_step> step;
    uint64_t id = 0;
    size_t missing = 0;
    std::vector<step_result> results;
    caf::error aborted; ///< an "aborted" reply: the cause comes from elsewhere
    bool want_trace = false;
    callback done;
  };

  void register_then_run(caf::event_based_actor* self, std::shared_ptr<prepared_step> step,
                         std::map<int32_t, tensor> feeds, bool want_trace, callback done,
                         int attempts_left);
  void dispatch(caf::event_based_actor* self, std::shared_ptr<prepared_step> step,
                std::map<int32_t, tensor> feeds, bool want_trace, callback done);
  void finish(uint64_t id, caf::error err);
  static step_outputs assemble(const prepared_step& step, std::vector<step_result>& results,
                               bool want_trace);

  std::map<uint64_t, in_flight> running_;
  std::set<caf::actor_addr> monitored_;
  uint64_t next_step_ = 1;
  std::mt19937_64 ids_;
};

} // namespace af
