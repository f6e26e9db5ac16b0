#pragma once
/// The host code of TensorFlow's dynamic_partition and dynamic_stitch, and
/// of size and range, which a partitioned lookup needs (graph/embedding.hpp
/// builds them). Every id is checked before anything is written: a bad one
/// is a sentence naming it and its position, never a write out of bounds.

#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"

namespace af::kernels {

/// Output `index` of tf.dynamic_partition(data, partitions, num_partitions):
/// the slices data[j...] with partitions[j...] == index, in order, of shape
/// [count] + data.shape[rank(partitions):] (partitions' shape a prefix of
/// data's; int32 or int64 partitions; any dtype of data). A partition id out
/// of [0, num_partitions) is refused naming it and its position:
/// "partitions[2] = 5 is not in [0, 3)".
status host_dynamic_partition(const tensor& data, const tensor& partitions,
                              int32_t num_partitions, int32_t index, tensor& out);

/// tf.dynamic_stitch(indices, data): merged[indices[m][i...]] = data[m][i...,
/// ...], m = 0, 1, ... in order, so a later index overwrites an earlier one
/// (TF's documented semantics). data[m].shape = indices[m].shape + a shape
/// common to all; merged has max(index) + 1 rows (rows no index names are
/// zeros: TF leaves them undefined). A negative index is refused naming it.
status host_dynamic_stitch(const std::vector<tensor>& indices, const std::vector<tensor>& data,
                           tensor& out);

/// tf.size(x) as an int32 scalar.
status host_size(const tensor& x, tensor& out);

/// tf.range(limit): int32 [0, limit) of an int scalar limit >= 0.
status host_range(const tensor& limit, tensor& out);

} // namespace af::kernels
