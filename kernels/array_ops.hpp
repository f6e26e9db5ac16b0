#pragma once
/// Array ops that a sparse gradient (graph/graph.hpp, gradient_value) is
/// built from, TensorFlow's semantics: concat on axis 0 (two sparse
/// gradients add up by concatenating their ids and their rows) and
/// flatten_rows (a gather's gradient rows [n, row...] from ids of any rank).
/// deduplicate's segment count is `size` (kernels/partition_ops.hpp).
/// On the host whatever the backend, as unique is.

#include <cstdint>

#include "kernels/kernels.hpp"

namespace af::kernels {

/// The shape of concat(a, b) on axis 0: [a[0] + b[0]] + a[1:], or why not
/// (equal dtypes, rank >= 1, equal dimensions after the first). A first
/// dimension may be unknown_dim (op_registry.hpp): then so is the result's.
status concat_shape(const shape_type& a, dtype a_type, const shape_type& b, dtype b_type,
                    shape_type& out);

/// tf.concat([a, b], axis=0): a's rows, then b's. Any dtype.
status host_concat(const tensor& a, const tensor& b, tensor& out);

/// The shape of flatten_rows(x, ids): [elements of ids] + x.shape[rank(ids):],
/// where x's shape starts with ids' (a gather's output does); unknown_dim
/// in ids' shape makes the first dimension unknown.
status flatten_rows_shape(const shape_type& x, const shape_type& ids, shape_type& out);

/// x with its leading rank(ids) dimensions merged into one (TF's reshape
/// of a gather's gradient to [size(ids)] + params.shape[1:]): the same
/// buffer, no copy. With x = ids, the ids as a 1-D tensor.
status host_flatten_rows(const tensor& x, const tensor& ids, tensor& out);

} // namespace af::kernels
