#pragma once
/// The node's directory for its data plane (net/data_plane.hpp): variables,
/// aggregators and executors by name, so that a data-plane thread reaches
/// them without an actor hop. It is the runtime's plane_handler
/// (net/plane_handler.hpp): the data-plane server hands it each request
/// frame (actors/plane_handler.cpp serves them).

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "caf/expected.hpp"

#include "actors/plane_push.hpp"
#include "actors/push_gate.hpp"
#include "actors/variable.hpp"
#include "messages/aggregator.hpp"
#include "messages/executor.hpp"
#include "net/plane_handler.hpp"

namespace af {

/// Name -> variable of one node: the node actor writes, the data-plane
/// threads read.
class variable_directory : public plane_handler {
public:
  struct entry {
    variable_cell_actor actor;         ///< told of first values; may be null (tests)
    std::shared_ptr<variable_cell> cell;
  };
  void put(const std::string& name, entry e);

  /// The entry of `name`; an empty one (null cell) if there is none.
  entry get(const std::string& name) const;

  /// Removes `name` if `actor` is still the one registered under it (a
  /// variable whose actor ended is no longer served by name).
  void remove(const std::string& name, const caf::actor_addr& actor);

  /// Removes `name` whatever is registered.
  void remove(const std::string& name);

  // -- aggregators (messages/aggregator.hpp), reached by push/pull frames ----

  struct aggregator_entry {
    aggregator_actor actor;
    size_t floats = 0;                    ///< a push carries exactly this many
    std::chrono::milliseconds wait{30000}; ///< how long a push may wait for its step
    /// With tables (aggregator_spec::sparse): the floats of its dense
    /// variables (a sparse push carries these), and each table's row shape
    /// (shape[1:]) and rows, in the spec's order.
    size_t dense_floats = 0;
    std::vector<shape_type> table_rows;
    std::vector<int64_t> table_sizes;
    /// Its members' tokens (the aggregator admits each at its join): a
    /// push without its worker's is refused before its payload is read.
    /// Null: not checked here (the aggregator still checks).
    std::shared_ptr<push_gate> gate;
    /// Its own ways of taking a push on the data plane's thread (set when
    /// it is spawned; null or empty: every push goes to its actor).
    std::shared_ptr<const plane_push_paths> paths;
  };
  void put_aggregator(const std::string& name, aggregator_entry e);
  /// The entry of `name`; null if there is none. Shared, not copied: a
  /// data-plane thread looks its aggregator up for every push, and the
  /// entry's shapes were copied each time.
  std::shared_ptr<const aggregator_entry> get_aggregator(const std::string& name) const;
  void remove_aggregator(const std::string& name);

  /// How a data-plane thread asks an aggregator and waits for its answer
  /// (start_node sets it: a blocking request from a scoped actor). Arguments:
  /// the aggregator, the frame kind (push or pull), worker, step, who sent
  /// it (a push's token and number, and the connection's peer), the flat
  /// values (empty for pull or an abstention), the wait.
  /// An aggregator's answer: the global step, the flat parameters, and
  /// (a sync push) whether the push was dropped as late. A push's answer
  /// may instead carry its parameters in `parts` (params empty): the
  /// variables' own tensors, which the reply writes one after the other
  /// (push_credentials::parts). The caller clears them once written.
  struct aggregator_answer {
    uint64_t global_step = 0;
    tensor params;
    bool dropped_late = false;
    std::shared_ptr<answer_parts> parts;
  };
  using aggregator_call = std::function<caf::expected<aggregator_answer>(
    const aggregator_actor&, uint8_t, uint32_t, uint64_t, push_credentials, tensor,
    std::chrono::milliseconds)>;
  void set_aggregator_call(aggregator_call f);
  aggregator_call aggregator_caller() const;

  /// The same for a sparse push (wire::kind::push_sparse): the aggregator,
  /// worker, step, who, the values, the wait; the answer's params are empty.
  using sparse_aggregator_call = std::function<caf::expected<aggregator_answer>(
    const aggregator_actor&, uint32_t, uint64_t, push_credentials, sparse_push_values,
    std::chrono::milliseconds)>;
  void set_sparse_aggregator_call(sparse_aggregator_call f);
  sparse_aggregator_call sparse_aggregator_caller() const;

  // -- executors, reached by edge frames (values between partitions) --------

  /// Under its full device name ("/job:J/replica:0/task:T/device:CPU:0").
  void put_executor(const std::string& device, executor_actor e);
  /// The executor of `device`; null if there is none.
  executor_actor get_executor(const std::string& device) const;
  void remove_executor(const std::string& device);

  // -- for whoever watches the node (metrics/node_metrics.hpp, at a scrape) ---

  /// Its executors now, by full device name.
  std::vector<std::pair<std::string, executor_actor>> executors() const;
  /// Its aggregators now, by name.
  std::vector<std::pair<std::string, aggregator_actor>> aggregators() const;

  // -- plane_handler (actors/plane_handler.cpp) ------------------------------

  /// Applied to the variable's cell right here (no actor hop); the variable
  /// actor hears only of a first value (released_atom).
  bool variable_op(plane_request& req) override;
  /// Through aggregator_caller(); the reply carries the step and parameters.
  bool aggregate(plane_request& req) override;
  /// The rows of a table (variable_cell::gather_rows), read right here.
  bool gather_rows(plane_request& req) override;
  /// Every part's rows or value into one answer (actors/plane_gather.cpp).
  bool gather_many(plane_request& req) override;
  /// To the executor as a local message, within its edge budget
  /// (actors/edge_budget.hpp).
  bool edge(plane_request& req) override;

private:
  mutable std::mutex mtx_;
  std::unordered_map<std::string, entry> vars_;
  std::unordered_map<std::string, std::shared_ptr<const aggregator_entry>> aggs_;
  std::unordered_map<std::string, executor_actor> execs_;
  aggregator_call call_;
  sparse_aggregator_call sparse_call_;
  /// aggregate()'s sparse push (wire::kind::push_sparse).
  bool push_sparse(plane_request& req, const std::string& name, push_credentials who);
  /// aggregate()'s streamed push that a pipelined round took
  /// (actors/plane_streamed.cpp): read piece by piece while the answer's
  /// chunks go back as they are ready (each wait bounded by `agg`'s), then
  /// the trailer with `agg`'s reply flags (plane_push_paths::reply_flags).
  bool stream_push(plane_request& req, streamed_push& push, const std::string& name,
                   const aggregator_entry& agg);
};

} // namespace af
