#pragma once
/// One worker's traffic with the ps tasks of a sparse job (issue 25;
/// dist/sparse_job.hpp): a step's ids go out, their rows come back, their
/// gradients go out, and nothing else. Per table, the step's ids are made
/// unique (a hot id travels once per shard, however often the batch names
/// it), routed to their shards (kernels/shard_routing.hpp), and each ps is
/// asked for the rows of its shards only, on its own data-plane connection
/// and its own thread, so the shards answer in parallel. The gradient of
/// each distinct row goes back to the shard it came from as a sparse push
/// (wire::kind::push_sparse) to that ps's aggregator, which applies it
/// (async) or merges the workers' (sync).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "core/tensor.hpp"
#include "kernels/shard_routing.hpp"
#include "messages/aggregator.hpp"
#include "net/data_plane.hpp"
#include "train/sparse_model.hpp"

namespace af {

/// A table of the job as every worker routes it.
struct routed_table {
  train::table_spec spec;
  kernels::shard_router router; ///< shard k lives on ps task k
};

/// One ps task as a worker of a sparse job reaches it.
struct sparse_ps {
  std::string task;       ///< "/job:ps/task:k", for messages
  std::string aggregator; ///< its aggregator's name on that node
  aggregator_actor actor; ///< for join, done and stats (control)
  std::unique_ptr<data_channel> chan;
  std::string token;      ///< from the aggregator's answer to join
  uint64_t seq = 0;       ///< the last push number used
  bool dense = false;     ///< it holds the dense parameters too (ps 0)
};

/// One table's share of a step: its distinct ids and where each goes.
struct table_step {
  std::vector<int64_t> unique;             ///< distinct ids, in the order first seen
  std::vector<int32_t> index;              ///< per example: its id's place in `unique`
  std::vector<std::vector<int64_t>> local; ///< per shard: rows of that shard to read
  std::vector<std::vector<int32_t>> place; ///< per shard: where each of them is in `unique`
};

/// Deduplicates and routes `ids` of `t`. An id outside the table is
/// invalid_argument naming the table, the example and the id (nothing is sent).
caf::expected<table_step> route_ids(const routed_table& t, const std::vector<int64_t>& ids);

/// What a fetch brings back: per table its distinct ids' rows
/// ([unique, width], in `unique`'s order), and the dense parameters.
struct fetched_rows {
  std::vector<tensor> rows;
  std::vector<tensor> dense;
  uint64_t bytes = 0; ///< payload bytes that crossed the wire (ids out, rows back)
};

/// The links and tables of one worker, and the step's exchanges.
class sparse_exchange {
public:
  sparse_exchange(std::vector<routed_table> tables, std::vector<std::string> dense_names,
                  std::vector<sparse_ps> ps, std::chrono::milliseconds timeout)
    : tables_(std::move(tables)), dense_names_(std::move(dense_names)), ps_(std::move(ps)),
      timeout_(timeout) {}

  const std::vector<routed_table>& tables() const { return tables_; }
  std::vector<sparse_ps>& ps() { return ps_; }

  /// The rows `steps` names (one table_step per table), every ps asked at
  /// once, and the dense parameters (from the ps that holds them).
  caf::expected<fetched_rows> fetch(const std::vector<table_step>& steps);

  /// Pushes the step's gradients: to each ps, each of its shards' rows
  /// (`row_grads[t]` is [unique, width] in steps[t].unique's order) with the
  /// shard's own row ids, and the dense gradients to the ps that holds them;
  /// every ps at once. `wait` bounds a sync push's wait for the round.
  /// Returns the least global step the aggregators answered; `late` is set
  /// if any said the push was dropped as late. `bytes` (if given) is set to
  /// the payload bytes sent.
  caf::expected<uint64_t> push(uint32_t worker, uint64_t step, const std::vector<table_step>& steps,
                               const std::vector<tensor>& row_grads,
                               const std::vector<tensor>& dense_grads,
                               std::chrono::milliseconds wait, bool* late = nullptr,
                               uint64_t* bytes = nullptr);

private:
  std::vector<routed_table> tables_;
  std::vector<std::string> dense_names_;
  std::vector<sparse_ps> ps_;
  std::chrono::milliseconds timeout_;
};

} // namespace af
