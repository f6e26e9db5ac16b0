// dynamic_partition, dynamic_stitch, size and range on the host
// (kernels/partition_ops.hpp): rows are copied as bytes, so every dtype works,
// and every id is checked before the first byte is written.
#include "kernels/partition_ops.hpp"
#include "kernels/host_helpers.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

namespace af::kernels {

namespace {

/// `prefix` is a prefix of `shape`.
bool is_prefix(const shape_type& prefix, const shape_type& shape) {
  if (prefix.size() > shape.size())
    return false;
  for (size_t d = 0; d < prefix.size(); ++d)
    if (prefix[d] != shape[d])
      return false;
  return true;
}

} // namespace

status host_dynamic_partition(const tensor& data, const tensor& partitions,
                              int32_t num_partitions, int32_t index, tensor& out) {
  if (!is_id_type(partitions.type()))
    return status::dtype("dynamic_partition: partitions must be int32 or int64, got "
                         + partitions.summary());
  if (num_partitions < 1 || index < 0 || index >= num_partitions)
    return status::failure("dynamic_partition: output " + std::to_string(index)
                           + " of num_partitions = " + std::to_string(num_partitions)
                           + " does not exist (num_partitions >= 1, output in [0, num_partitions))");
  if (!is_prefix(partitions.shape(), data.shape()))
    return status::shape("dynamic_partition: partitions " + partitions.summary()
                         + " must have a prefix of data's shape " + data.summary());
  const size_t n = partitions.num_elements();
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) { // all checked, whichever output this node is
    auto p = integer_at(partitions, i);
    if (p < 0 || p >= num_partitions)
      return status::failure("partitions[" + std::to_string(i) + "] = " + std::to_string(p)
                             + " is not in [0, " + std::to_string(num_partitions) + ")");
    count += p == index ? 1 : 0;
  }
  shape_type shape{static_cast<int64_t>(count)};
  shape.insert(shape.end(), data.shape().begin() + static_cast<long>(partitions.shape().size()),
               data.shape().end());
  tensor result{data.type(), shape};
  const size_t slice_bytes = row_elements(data.shape(), partitions.shape().size())
                             * dtype_size(data.type());
  if (count > 0 && slice_bytes > 0) {
    const std::byte* src = data.bytes();
    std::byte* dst = result.mutable_bytes();
    for (size_t i = 0, k = 0; i < n; ++i)
      if (integer_at(partitions, i) == index)
        std::memcpy(dst + (k++) * slice_bytes, src + i * slice_bytes, slice_bytes);
  }
  out = std::move(result);
  return status::success();
}

status host_dynamic_stitch(const std::vector<tensor>& indices, const std::vector<tensor>& data,
                           tensor& out) {
  if (indices.empty() || indices.size() != data.size())
    return status::failure("dynamic_stitch takes as many indices as data tensors, at least one; got "
                           + std::to_string(indices.size()) + " and "
                           + std::to_string(data.size()));
  // The slice shape is data[0]'s after indices[0]'s dimensions; every pair must agree.
  shape_type slice(data[0].shape().begin() + static_cast<long>(std::min(
                     indices[0].shape().size(), data[0].shape().size())),
                   data[0].shape().end());
  int64_t rows = 0;
  for (size_t m = 0; m < indices.size(); ++m) {
    const auto &ids = indices[m], &d = data[m];
    auto name = "indices[" + std::to_string(m) + "]";
    if (!is_id_type(ids.type()))
      return status::dtype("dynamic_stitch: " + name + " must be int32 or int64, got "
                           + ids.summary());
    shape_type want = ids.shape();
    want.insert(want.end(), slice.begin(), slice.end());
    if (d.type() != data[0].type() || d.shape() != want)
      return status::shape("dynamic_stitch: data[" + std::to_string(m) + "] " + d.summary()
                           + " must be " + dtype_name(data[0].type()) + shape_string(want)
                           + " (" + name + "'s shape + the slice shape of data[0])");
    for (size_t i = 0; i < ids.num_elements(); ++i) {
      auto id = integer_at(ids, i);
      if (id < 0 || id >= INT32_MAX)
        return status::failure("dynamic_stitch: " + name + "[" + std::to_string(i) + "] = "
                               + std::to_string(id) + " is not in [0, 2^31 - 1)");
      rows = std::max(rows, id + 1);
    }
  }
  if (auto st = check_result_rows("dynamic_stitch", "rows", rows, row_elements(slice, 0),
                                  data[0].type());
      !st.ok())
    return st;
  shape_type shape{rows};
  shape.insert(shape.end(), slice.begin(), slice.end());
  tensor merged = tensor::filled(data[0].type(), shape, 0);
  const size_t slice_bytes = row_elements(slice, 0) * dtype_size(data[0].type());
  if (rows > 0 && slice_bytes > 0) {
    std::byte* dst = merged.mutable_bytes();
    for (size_t m = 0; m < indices.size(); ++m) { // in order: later ones overwrite
      const std::byte* src = data[m].bytes();
      for (size_t i = 0; i < indices[m].num_elements(); ++i)
        std::memcpy(dst + static_cast<size_t>(integer_at(indices[m], i)) * slice_bytes,
                    src + i * slice_bytes, slice_bytes);
    }
  }
  out = std::move(merged);
  return status::success();
}

status host_size(const tensor& x, tensor& out) {
  if (x.num_elements() > static_cast<size_t>(INT32_MAX))
    return status::failure("size: " + std::to_string(x.num_elements())
                           + " elements do not fit an int32");
  out = tensor::from_values<int32_t>({}, {static_cast<int32_t>(x.num_elements())});
  return status::success();
}

status host_range(const tensor& limit, tensor& out) {
  if (!is_id_type(limit.type()) || limit.num_elements() != 1)
    return status::dtype("range: limit must be one int32 or int64, got " + limit.summary());
  auto n = integer_at(limit, 0);
  if (auto st = check_result_rows("range", "limit", n, 1, dtype::int32); !st.ok())
    return st;
  tensor result{dtype::int32, {n}};
  if (n > 0) {
    int32_t* p = result.mutable_data<int32_t>();
    for (int64_t i = 0; i < n; ++i)
      p[i] = static_cast<int32_t>(i);
  }
  out = std::move(result);
  return status::success();
}

} // namespace af::kernels
