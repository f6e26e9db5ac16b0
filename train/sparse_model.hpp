#pragma once
/// A model over embedding tables, as a training job's worker runs it (issue
/// 25): the worker looks each table's ids up (deduplicated, one request per
/// shard), hands the model the unique rows it got back, and sends each shard
/// only its rows' gradients. The model never sees a whole table, only the
/// rows of one batch, so the same code serves one process, an embedded
/// cluster and ps tasks on other hosts. No CAF, no network: this is the
/// contract between the job (dist/) and the models (train/).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "core/variable_spec.hpp"
#include "graph/outcome.hpp"
#include "train/model.hpp"

namespace af::train {

/// One embedding table of a sparse model: `rows` x `width` float32, cut over
/// the ps tasks by the job (kernels/shard_routing.hpp's strategies).
struct table_spec {
  std::string name; ///< e.g. "user_emb"; its shards are "<name>/part_<k>"
  int64_t rows = 0;
  int64_t width = 0;
  initializer init; ///< of the whole table (each shard computes its own rows of it)
};

/// One batch: per table, the id each example looks up; a label per example.
struct sparse_batch {
  std::vector<std::vector<int64_t>> ids; ///< [table][example]
  std::vector<float> labels;             ///< [example], 0 or 1 for clicks
};

/// What one step of the model gives back.
struct sparse_step_result {
  double loss = 0;                  ///< mean over the batch
  std::vector<float> predictions;   ///< [example]: the model's output (a probability for clicks)
  /// Per table: d loss / d rows, [unique ids of the table, width], in the
  /// order of the `rows` the step was given (one row per distinct id, so a
  /// repeated id's gradients are already summed).
  std::vector<tensor> row_grads;
  std::vector<tensor> dense_grads;  ///< per dense parameter, its shape
};

/// A model whose parameters are embedding tables plus (optionally) a few
/// small dense parameters.
class sparse_model {
public:
  virtual ~sparse_model() = default;
  virtual std::vector<table_spec> tables() const = 0;
  virtual std::vector<parameter> dense_parameters() const = 0;
  /// Forward and backward for one batch. `rows[t]` is [u_t, width_t]: the
  /// rows of table t's distinct ids; `index[t][e]` is the row of `rows[t]`
  /// example e looks up (< u_t). `dense` holds the dense parameters' values.
  /// `want_grads` false: forward only (evaluation). An error names what is wrong.
  virtual outcome<sparse_step_result> step(const std::vector<tensor>& rows,
                                           const std::vector<std::vector<int32_t>>& index,
                                           const std::vector<tensor>& dense,
                                           const std::vector<float>& labels,
                                           bool want_grads) = 0;
};

} // namespace af::train
