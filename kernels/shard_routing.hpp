#pragma once
/// Where an id of a partitioned embedding table lives: which shard and which
/// row of it (TensorFlow's `embedding_lookup(params_list, ids,
/// partition_strategy)`). Plain C++, the one place this math is: the ops
/// `shard_of` and `row_in_shard` (kernels/op_registry.cpp) run it on a step's
/// ids, and the table builder (graph/embedding.hpp) lays shards out with it.
/// It is in kernels/ because an op's kernel must reach it and kernels/ is the
/// lowest layer both it and graph/ see.
///
/// A table of R rows over n shards:
///   mod:        id p is row p / n of shard p % n (TF's default).
///   div:        contiguous pieces, the first R % n one row longer (TF's
///               formula with ids_per_partition = R / n and extras = R % n).
///   contiguous: contiguous pieces of any given sizes (what the size-balanced
///               partitioner of train/partition.hpp cuts; div is its special
///               case with TF's sizes).
/// mod and div hold shards of TF's sizes: shard i has R / n rows, plus one if
/// i < R % n.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernels.hpp"

namespace af::kernels {

enum class partition_strategy : uint8_t { mod = 0, div = 1, contiguous = 2 };

/// "mod", "div", "contiguous".
const char* to_string(partition_strategy s);

/// The strategy named `s`, if it is one.
std::optional<partition_strategy> parse_partition_strategy(std::string_view s);

/// The rows of each of `shards` shards of a table of `rows` rows as mod and
/// div lay them out: rows / shards each, the first rows % shards one more.
std::vector<int64_t> balanced_shard_rows(int64_t rows, int64_t shards);

/// One id's place: rows `row` of shard `shard`.
struct shard_place {
  int64_t shard = 0;
  int64_t row = 0;
  bool operator==(const shard_place& o) const { return shard == o.shard && row == o.row; }
};

/// A table's layout, checked, ready to route ids.
class shard_router {
public:
  /// The router of `strategy` over shards of `shard_rows` rows. Refused: no
  /// shard, a negative size, or (mod, div) sizes other than
  /// balanced_shard_rows of their total, naming the sizes expected.
  static status make(partition_strategy strategy, std::vector<int64_t> shard_rows,
                     shard_router& out);

  partition_strategy strategy() const { return strategy_; }
  int64_t total_rows() const { return total_; }
  const std::vector<int64_t>& shard_rows() const { return rows_; }

  /// Where id `id`, in [0, total_rows()), lives (not checked: see contains).
  shard_place place(int64_t id) const;
  bool contains(int64_t id) const { return id >= 0 && id < total_; }

private:
  partition_strategy strategy_ = partition_strategy::mod;
  std::vector<int64_t> rows_;
  std::vector<int64_t> begin_; ///< contiguous: the first id of each shard
  int64_t total_ = 0;
  int64_t per_ = 0;    ///< div: ids_per_partition = total / n
  int64_t extras_ = 0; ///< div: total % n
};

/// shard_of (want_row false: int32 shards) or row_in_shard (want_row true:
/// rows in ids' dtype) of int32/int64 `ids`, any rank, for the table laid out
/// by `strategy` over the shard sizes `shard_rows` (1-D int32/int64). An id
/// not in [0, rows) is refused before anything is written, naming it and its
/// position: "ids[2] = 17 is not a row of the table: not in [0, 10)".
status host_route(const tensor& ids, const tensor& shard_rows, partition_strategy strategy,
                  bool want_row, tensor& out);

} // namespace af::kernels
