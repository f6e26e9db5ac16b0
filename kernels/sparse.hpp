#pragma once
/// The sparse ops' host code, TensorFlow's semantics: gather
/// (tf.gather / tf.nn.embedding_lookup along axis 0), unique (tf.unique),
/// unsorted_segment_sum and the scatter updates of a variable
/// (tf.scatter_add / _sub / _update). The CPU backend runs these; the CUDA
/// backend checks ids with check_ids on the host before it launches, so a
/// bad id is an error on every backend and never a read or write out of
/// bounds. Ids are int32 or int64 of any rank.

#include <cstdint>

#include "kernels/kernels.hpp"

namespace af::kernels {

/// Every id of `ids` (int32 or int64) in [0, limit), else the first one
/// that is not, in TF's words: "indices[3] = 17 is not in [0, 10)" (`what`
/// is the name of the ids, "indices" or "segment_ids"). With
/// `skip_negative`, negative ids are allowed (unsorted_segment_sum drops
/// them) and only ids >= limit are refused.
status check_ids(const tensor& ids, int64_t limit, const char* what, bool skip_negative = false);

/// The shape of params[indices]: indices.shape + params.shape[1:], or why
/// they do not fit (params needs at least one dimension, indices an
/// integer dtype, and the result, where no dim is unknown_dim, at most
/// max_decoded_tensor_bytes(): check_result_rows, "gather: ids = ...").
status gather_shape(const shape_type& params, dtype params_type, const shape_type& indices,
                    dtype indices_type, shape_type& out);

/// gather_shape and check_ids of a gather about to run, failures prefixed
/// "gather: ": what every backend checks before it reads a row.
status check_gather(const tensor& params, const tensor& indices, shape_type& out);

/// out = params[indices] along axis 0, any dtype of params (rows are copied
/// as bytes). An id out of [0, rows) is refused before anything is read.
status host_gather(const tensor& params, const tensor& indices, tensor& out);

/// The shape of unsorted_segment_sum: [num_segments] + data.shape[rank(ids):],
/// where segment_ids' shape must be a prefix of data's.
status segment_sum_shape(const shape_type& data, const shape_type& ids, int64_t num_segments,
                         shape_type& out);

/// out[s] = the sum of data[j...] over the j... with segment_ids[j...] == s,
/// zero for a segment no id names; negative ids are dropped (TF); an id >=
/// num_segments is refused (TF on the CPU). Float32/64, int32/64 data.
status host_unsorted_segment_sum(const tensor& data, const tensor& segment_ids,
                                 int64_t num_segments, tensor& out);

/// The scalar `num_segments` (int32 or int64, one element, >= 0), or why not.
status read_num_segments(const tensor& t, int64_t& out);

/// tf.unique of a 1-D int32 or int64 tensor: `y` the distinct values in the
/// order of their first occurrence, `idx` (int32, x's shape) such that
/// x[i] == y[idx[i]]. Either output may be null.
status host_unique(const tensor& x, tensor* y, tensor* idx);

/// The scatter updates of a variable's value `ref`.
enum class scatter_op { add, sub, update };

/// "scatter_add", "scatter_sub", "scatter_update": the graph's update ops.
const char* to_string(scatter_op op);

/// The scatter_op of a graph op name ("scatter_add"), if it is one.
std::optional<scatter_op> parse_scatter_op(std::string_view name);

/// ref[indices[i...], ...] (op)= updates[i..., ...], TF's tf.scatter_*:
/// updates has shape indices.shape + ref.shape[1:] (or is a scalar, applied
/// to every row named) and ref's dtype. Duplicate ids accumulate for add and
/// sub; for update the last one in indices' order wins (TF leaves the order
/// undefined; here it is deterministic). Everything is checked first: on an
/// error `ref` is unchanged (no partial write). A buffer that others hold
/// is copied before the write (tensor's copy on write).
status host_scatter(scatter_op op, tensor& ref, const tensor& indices, const tensor& updates);

} // namespace af::kernels
