#pragma once
/// Partitioned variables (TF's fixed_size_partitioner and
/// min_max_variable_partitioner), no CAF: which pieces the model's parameters
/// are cut into, which ps task holds each piece, and the row slicing between a
/// parameter's logical tensor and its pieces' values.
///
/// A parameter of R rows (its first axis; a scalar has one) and B bytes is cut
/// along axis 0 into k = max(1, min(max_partitions, R, B / min_slice_bytes))
/// pieces of near-equal rows: as TF does, the first R % k pieces get one row
/// more. A piece is named "<parameter>/part_<i>" when k > 1, else it keeps the
/// parameter's name.
///
/// The pieces are spread over the ps tasks by size: largest first, each onto the
/// ps with the fewest bytes so far (ties: the lower index), so the bytes per ps
/// differ by at most one piece. TF spreads them round robin by count, which can
/// leave one ps with most of the bytes. With max_partitions = 1 nothing is
/// cut and parameter i goes to ps i % n_ps, the placement of the jobs and
/// checkpoints from before partitioning (TF's replica_device_setter).
///
/// Checkpoints hold the logical parameters: pieces are assembled before saving
/// and cut again on restore, so a job can resume on another number of ps tasks
/// or with another max_partitions.

#include <cstdint>
#include <string>
#include <vector>

#include "graph/outcome.hpp"
#include "core/tensor.hpp"
#include "train/checkpoint.hpp"
#include "train/model.hpp"

namespace af::train {

/// One piece of a parameter: rows [row_begin, row_end) of its first axis.
struct piece {
  std::string name;         ///< "<parameter>/part_<i>", or the parameter's name if k = 1
  size_t param = 0;         ///< index into the model's parameters
  uint32_t part = 0;        ///< i of `parts`
  uint32_t parts = 1;       ///< k: how many pieces the parameter is cut into
  int64_t row_begin = 0;
  int64_t row_end = 1;
  shape_type shape;         ///< the piece's: the parameter's with row_end - row_begin rows
  shape_type logical_shape; ///< the parameter's
  uint64_t bytes = 0;       ///< float32 bytes of the piece
  uint32_t ps = 0;          ///< the ps task that holds it

  bool whole() const { return parts == 1; }
};

/// Every piece of every parameter, in parameter order, then part order.
struct partition_plan {
  uint32_t ps_tasks = 1;
  std::vector<piece> pieces;

  /// The indices into `pieces` held by ps `k`, in plan order (an aggregator's
  /// push order).
  std::vector<size_t> on_ps(uint32_t k) const;

  /// Bytes of the pieces each ps holds.
  std::vector<uint64_t> bytes_per_ps() const;
};

/// A parameter's pieces as the shards of a partitioned embedding table
/// (graph/embedding.hpp): the size-balanced cut, strategy `contiguous` (or
/// `div`, whose sizes the planner's are: the first R % k one row longer).
struct table_layout {
  std::vector<int64_t> shard_rows; ///< each piece's rows, in part order
  std::vector<uint32_t> ps;        ///< the ps task that holds each piece
};

/// The layout of parameter `param`'s pieces in `plan` (empty if it has none).
table_layout table_layout_of(const partition_plan& plan, size_t param);

/// k for a parameter of `shape` holding `bytes` bytes (see the file comment).
uint32_t partitions_for(const shape_type& shape, uint64_t bytes, uint32_t max_partitions,
                        uint64_t min_slice_bytes);

/// The plan for `params` (float32) over `ps_tasks` ps tasks. An error if
/// ps_tasks or max_partitions is 0 or min_slice_bytes is 0.
outcome<partition_plan> plan_partitions(const std::vector<parameter>& params, uint32_t ps_tasks,
                                        uint32_t max_partitions, uint64_t min_slice_bytes);

/// Rows [begin, end) of `t`'s first axis as a tensor of their own (a copy);
/// `t` itself when they are all of its rows.
tensor slice_rows(const tensor& t, int64_t begin, int64_t end);

/// Piece `p`'s slice of its parameter's logical value (checked: an error names
/// the piece if `logical` does not have the parameter's shape).
outcome<tensor> slice_of(const piece& p, const tensor& logical);

/// Puts `value`, piece `p`'s, into its rows of `logical`: a whole piece
/// becomes `logical` (no copy); otherwise `logical` is allocated with the
/// parameter's shape if it has another (empty, or a previous value) and the
/// rows are copied in. An error names the piece if `value` has another shape.
graph_status put_piece(const piece& p, tensor value, tensor& logical);

/// The rows each of `pieces` holds of `values` (one tensor per parameter), in
/// the pieces' order: what a push to the shard that holds them carries (a
/// whole parameter goes as it is, sharing its buffer; slice_rows).
std::vector<tensor> rows_for(const std::vector<piece>& pieces, const std::vector<tensor>& values);

/// Takes `flat`, the values of `pieces` one after another (a shard's answer
/// to a push or pull), into `into` (one tensor per parameter; put_piece: a
/// whole parameter is its piece, no copy). `into` is complete once every
/// shard's answer is in. An error names what does not fit.
graph_status take_pieces(const std::vector<piece>& pieces, const tensor& flat,
                         std::vector<tensor>& into);

/// The values of every piece of `plan`, in plan order, cut from the logical
/// values (one per parameter).
outcome<std::vector<tensor>> split_into_pieces(const partition_plan& plan,
                                               const std::vector<tensor>& logical);

/// The logical values (one per parameter, `params` of the plan) assembled from
/// every piece's value, in plan order.
outcome<std::vector<tensor>> assemble_pieces(const partition_plan& plan, size_t params,
                                             const std::vector<tensor>& pieces);

/// The logical variables (values and optimizer slots, one per parameter) from
/// `saved`, which holds the variables of `pieces` by their names (as the
/// aggregators save them). Variables of `saved` that are no piece's are
/// dropped; a piece missing from `saved` is an error naming it.
outcome<std::vector<saved_variable>> logical_variables(const std::vector<parameter>& params,
                                                       const std::vector<piece>& pieces,
                                                       const std::vector<saved_variable>& saved);

/// Piece `p`'s part of a checkpoint's logical variable: the rows of its value
/// and of each slot named in `slot_names` (a slot the checkpoint lacks is
/// filled with `starts[k]`, train::slot_initial_value, else zeros), in that
/// order. An error naming the variable and `where` if the checkpoint lacks it
/// or its shape is not the parameter's.
outcome<saved_variable> piece_of_checkpoint(const piece& p, const std::string& param_name,
                                            const checkpoint& ck,
                                            const std::vector<std::string>& slot_names,
                                            const std::string& where,
                                            const std::vector<float>& starts = {});

} // namespace af::train
