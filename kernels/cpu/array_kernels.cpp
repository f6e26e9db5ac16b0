// The array ops of sparse gradients on the host (kernels/array_ops.hpp):
// concat on axis 0 and flatten_rows.
#include "kernels/array_ops.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace af::kernels {

namespace {

constexpr int64_t unknown = -1; // op_registry.hpp's unknown_dim

} // namespace

status concat_shape(const shape_type& a, dtype a_type, const shape_type& b, dtype b_type,
                    shape_type& out) {
  if (a_type != b_type)
    return status::dtype("concat: dtypes differ: " + std::string{dtype_name(a_type)} + " and "
                         + dtype_name(b_type));
  if (a.empty() || b.empty() || a.size() != b.size()
      || !std::equal(a.begin() + 1, a.end(), b.begin() + 1))
    return status::shape("concat on axis 0 needs shapes of one rank >= 1 that differ only in "
                         "their first dimension, got " + shape_string(a) + " and "
                         + shape_string(b));
  out = a;
  out[0] = a[0] == unknown || b[0] == unknown ? unknown : a[0] + b[0];
  return status::success();
}

status host_concat(const tensor& a, const tensor& b, tensor& out) {
  shape_type shape;
  if (auto st = concat_shape(a.shape(), a.type(), b.shape(), b.type(), shape); !st.ok())
    return st;
  tensor result{a.type(), std::move(shape)};
  if (a.nbytes() > 0)
    std::memcpy(result.mutable_bytes(), a.bytes(), a.nbytes());
  if (b.nbytes() > 0)
    std::memcpy(result.mutable_bytes() + a.nbytes(), b.bytes(), b.nbytes());
  out = std::move(result);
  return status::success();
}

status flatten_rows_shape(const shape_type& x, const shape_type& ids, shape_type& out) {
  if (ids.size() > x.size() || !std::equal(ids.begin(), ids.end(), x.begin()))
    return status::shape("flatten_rows: " + shape_string(x) + " does not start with the ids' shape "
                         + shape_string(ids));
  int64_t n = 1;
  for (auto d : ids)
    n = d == unknown || n == unknown ? unknown : n * d;
  out = {n};
  out.insert(out.end(), x.begin() + static_cast<std::ptrdiff_t>(ids.size()), x.end());
  return status::success();
}

status host_flatten_rows(const tensor& x, const tensor& ids, tensor& out) {
  shape_type shape;
  if (auto st = flatten_rows_shape(x.shape(), ids.shape(), shape); !st.ok())
    return st;
  out = x.reshaped(std::move(shape));
  return status::success();
}

} // namespace af::kernels
