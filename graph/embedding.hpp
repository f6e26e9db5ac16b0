#pragma once
/// Partitioned embedding tables at the graph level (TF's
/// `embedding_lookup(params_list, ids, partition_strategy)` over a
/// partitioned variable): a table declared once as shard variables spread
/// over devices (the ps tasks), and the lookup subgraph TF builds:
///
///   ids -> unique -> shard_of / row_in_shard (the strategy) -> dynamic_partition
///       -> one gather per shard, placed on that shard's device
///       -> dynamic_stitch (the unique ids' order) -> gather by unique_idx (the batch's order)
///
/// So a lookup sends each shard only the rows it holds that the step names,
/// once each, and the gradient flows back through the per-shard gathers:
/// each shard's gradient is computed on its device, from its rows' gradients
/// only. docs/sparse.md "Partitioned tables" draws it; the routing math is
/// kernels/shard_routing.hpp.

#include <cstdint>
#include <string>
#include <vector>

#include "core/device_name.hpp"
#include "core/variable_spec.hpp"
#include "graph/graph.hpp"
#include "kernels/shard_routing.hpp"

namespace af {

/// tf.dynamic_partition(data, partitions, num_partitions): one op per output
/// (a graph node has one), output p the slices of `data` whose id in
/// `partitions` (int32/int64, a prefix of data's shape) is p. An id out of
/// [0, num_partitions) fails the step naming it and its position.
std::vector<output> dynamic_partition(graph& g, output data, output partitions,
                                      int32_t num_partitions,
                                      const std::string& name = "dynamic_partition");

/// tf.dynamic_stitch(indices, data): merged[indices[m][i...]] = data[m][i...,
/// ...], a later m overwriting an earlier one; as many indices as data.
output dynamic_stitch(graph& g, const std::vector<output>& indices,
                      const std::vector<output>& data, const std::string& name = "dynamic_stitch");

/// A declared partitioned table: its shard variables in the strategy's order
/// (shard i of mod holds ids i, i + n, ...; of div and contiguous, the i-th
/// run of ids).
struct embedding_table {
  std::string name;
  kernels::partition_strategy strategy = kernels::partition_strategy::mod;
  std::vector<int64_t> shard_rows; ///< rows of each shard
  std::vector<output> shards;      ///< the shard variables

  /// The rows of the whole (logical) table.
  int64_t rows() const;
};

/// "<table>/part_<i>", the shards' names (TF's, and train/partition.hpp's).
std::string shard_name(const std::string& table, size_t i);

/// `init` as the initializer of a whole table: a random one (uniform,
/// normal) drawn per element from (seed, row, column), rows from 0
/// (kernels/table_init.hpp); any other kind as it is. The one-piece table
/// whose rows every shard_initializer's shard holds.
initializer table_initializer(initializer init);

/// The initializer of shard `k` of a table cut by `strategy` into shards of
/// `shard_rows` rows: table_initializer(init) with the shard's global rows
/// (mod: k, k + n, ...; div, contiguous: its run). Evaluated on the shard's
/// node (a session's variable), it gives exactly that shard's rows of the
/// one-piece table's values, without the table anywhere.
initializer shard_initializer(initializer init, kernels::partition_strategy strategy,
                              const std::vector<int64_t>& shard_rows, size_t k);

/// The table `name` over variables that exist already (`shards`, in the
/// strategy's order; a session creates them on their nodes, with
/// shard_initializer). Refused: no shard, a node that is not a variable,
/// shards of different dtypes or row shapes, rows that do not fit the
/// strategy (mod and div need TF's sizes: kernels::balanced_shard_rows), or
/// a shard whose table initializer names other rows than the shard's (shards
/// out of order: its values would be another shard's).
outcome<embedding_table> embedding_table_of(const graph& g, const std::string& name,
                                            kernels::partition_strategy strategy,
                                            std::vector<output> shards);

/// Declares table `name` of `shape` ([rows, dim, ...]) cut into one shard
/// per device of `devices` (shard i on devices[i]: the ps tasks), by
/// `strategy`; each shard is the variable shard_name(name, i) with the
/// rows its strategy gives it and shard_initializer(init): a random `init`
/// gives each shard its rows of the one-piece table's values
/// (table_initializer(init)). contiguous takes `shard_rows` (the
/// size-balanced partitioner's cut, summing to the rows), or TF's balanced
/// sizes when it is empty.
outcome<embedding_table> partitioned_table(graph& g, const std::string& name, shape_type shape,
                                           const std::vector<device_name>& devices,
                                           kernels::partition_strategy strategy,
                                           initializer init = initializer::zeros(),
                                           dtype type = dtype::float32,
                                           std::vector<int64_t> shard_rows = {});

/// The rows `ids` (1-D int32 or int64, duplicates and any order allowed) of
/// table `t`, in ids' order: [len(ids)] + the row shape, equal to a gather
/// of the unpartitioned table. The ops before the gathers run in the current
/// scope (the worker); each shard's gather runs on its shard's device. An id
/// outside [0, t.rows()) fails the step, naming the id and the table (the op
/// "<table>/route").
outcome<output> embedding_lookup(graph& g, const embedding_table& t, output ids,
                                 const std::string& name = "");

} // namespace af
