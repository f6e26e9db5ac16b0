#pragma once
/// Random initial values of an embedding table, element by element: each
/// element's value is a function of (seed, its global row, its column) only
/// (a counter-based generator: a hash of the three, no state carried from
/// one element to the next). So a shard of a partitioned table computes
/// exactly its rows of the unpartitioned table's values on its own node,
/// without generating any row before them and without the table existing
/// anywhere: shard k of mod over n shards fills global rows k, k + n, ...;
/// of div or contiguous, its run. Large fills are spread over threads (each
/// row is independent). graph/embedding.hpp gives each shard its rows
/// (initializer::table, row_start, row_stride; core/variable_spec.hpp).

#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace af::kernels {

/// Which distribution fill_table draws from.
enum class table_distribution : uint8_t { uniform, normal };

/// Where a table's local rows are in the whole table: local row r is global
/// row `start + r * stride`.
struct table_rows {
  int64_t start = 0;
  int64_t stride = 1;
};

/// Fills float32 or float64 `t` ([rows, ...], at least rank 1) with
/// U[a, b) (uniform) or N(a, b) (normal: mean a, stddev b), the element at
/// local row r and flat column c (of the row's product of the other
/// dimensions) being the value of (seed, rows.start + r * rows.stride, c)
/// (a normal: of the column pair c / 2, Box-Muller's cosine branch for an
/// even c, its sine for an odd one).
/// Refused (nothing written): low >= high, stddev <= 0, rank 0, a negative
/// start, a stride < 1, a global row past int64, another dtype.
status fill_table(tensor& t, table_distribution dist, double a, double b, uint64_t seed,
                  table_rows rows);

} // namespace af::kernels
