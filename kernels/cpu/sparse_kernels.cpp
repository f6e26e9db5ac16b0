// The sparse ops on the host (kernels/sparse.hpp): gather, unsorted_segment_sum,
// unique and the scatter updates. Every id is checked before the first
// byte is read or written, so a bad id is a sentence naming it, never an
// access out of bounds, and a refused scatter leaves its variable as it was.
#include "kernels/sparse.hpp"
#include "core/int_arith.hpp"
#include "kernels/host_helpers.hpp"
#include "kernels/id_dedup.hpp"

#include <cstring>
#include <string>

namespace af::kernels {

namespace {

/// Calls f(T{}) with T the C++ type of a dtype.
template <class F>
void with_type(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: f(float{}); break;
    case dtype::float64: f(double{}); break;
    case dtype::int32: f(int32_t{}); break;
    case dtype::int64: f(int64_t{}); break;
  }
}

/// x + y or x - y, integers wrapping as the dense kernels do (core/int_arith.hpp).
template <class T>
T accumulate(scatter_op op, T x, T y) {
  return op == scatter_op::sub ? int_arith::wrap_sub(x, y) : int_arith::wrap_add(x, y);
}

} // namespace

status check_ids(const tensor& ids, int64_t limit, const char* what, bool skip_negative) {
  if (!is_id_type(ids.type()))
    return status::dtype(std::string{what} + " must be int32 or int64, got "
                         + dtype_name(ids.type()));
  size_t bad = 0;
  int64_t bad_id = 0;
  bool ok = each_id(ids, [&](size_t i, int64_t id) {
    if (id < limit && (id >= 0 || skip_negative))
      return true;
    bad = i;
    bad_id = id;
    return false;
  });
  if (!ok)
    return status::failure(std::string{what} + "[" + std::to_string(bad) + "] = "
                           + std::to_string(bad_id) + " is not in [0, " + std::to_string(limit)
                           + ")");
  return status::success();
}

namespace {

/// indices.shape + params.shape[1:], or why they do not fit: gather_shape
/// without the result's bound, for a scatter, whose updates of that shape
/// are given to it (a scalar broadcast to every row named), not allocated.
status gather_dims(const shape_type& params, const shape_type& indices, dtype indices_type,
                   shape_type& out) {
  if (params.empty())
    return status::shape("params must have at least one dimension, got a scalar");
  if (!is_id_type(indices_type))
    return status::dtype(std::string{"indices must be int32 or int64, got "}
                         + dtype_name(indices_type));
  out = indices;
  out.insert(out.end(), params.begin() + 1, params.end());
  return status::success();
}

/// No dimension of `s` is unknown (a shape rule's unknown_dim, -1: unique's
/// length), so the size it gives is the size the op will have.
bool all_known(const shape_type& s) {
  for (auto d : s)
    if (d < 0)
      return false;
  return true;
}

} // namespace

status gather_shape(const shape_type& params, dtype type, const shape_type& indices,
                    dtype indices_type, shape_type& out) {
  shape_type shape;
  if (auto st = gather_dims(params, indices, indices_type, shape); !st.ok())
    return st;
  // A few bytes of ids name rows of kilobytes: the result is bounded as any
  // op's (max_message_bytes) before it is allocated, whoever asks (a graph,
  // a variable's gather over CAF). A shape rule may not know a dim yet (ids
  // from unique): then the kernel, which knows it, bounds the result.
  if (all_known(indices) && all_known(params)) {
    int64_t count = 1;
    for (auto d : indices)
      count = d > 0 && count > INT32_MAX / d ? INT32_MAX : count * d;
    if (auto st = check_result_rows("gather", "ids", count, row_elements(params, 1), type);
        !st.ok())
      return st;
  }
  out = std::move(shape);
  return status::success();
}

status check_gather(const tensor& params, const tensor& indices, shape_type& out) {
  auto st = gather_shape(params.shape(), params.type(), indices.shape(), indices.type(), out);
  if (st.ok())
    st = check_ids(indices, params.shape()[0], "indices");
  if (!st.ok() && st.error.rfind("gather: ", 0) != 0) // the result's bound names it already
    return status::failure("gather: " + st.error, st.what);
  return st;
}

status host_gather(const tensor& params, const tensor& indices, tensor& out) {
  shape_type shape;
  if (auto st = check_gather(params, indices, shape); !st.ok())
    return st;
  tensor result{params.type(), shape};
  const size_t row_bytes = row_elements(params.shape(), 1) * dtype_size(params.type());
  copy_rows(indices, params.bytes(), result.mutable_bytes(), row_bytes);
  out = std::move(result);
  return status::success();
}

status segment_sum_shape(const shape_type& data, const shape_type& ids, int64_t num_segments,
                         shape_type& out) {
  bool prefix = ids.size() <= data.size();
  for (size_t d = 0; prefix && d < ids.size(); ++d)
    prefix = ids[d] == data[d];
  if (!prefix)
    return status::shape("unsorted_segment_sum: segment_ids' shape " + shape_string(ids)
                         + " is not a prefix of data's " + shape_string(data));
  out = {num_segments};
  out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(ids.size()), data.end());
  return status::success();
}

status read_num_segments(const tensor& t, int64_t& out) {
  if (!is_id_type(t.type()) || t.num_elements() != 1)
    return status::failure("unsorted_segment_sum: num_segments must be one int32 or int64, got "
                           + t.summary());
  out = integer_at(t, 0);
  if (out < 0)
    return status::failure("unsorted_segment_sum: num_segments = " + std::to_string(out)
                           + " is negative");
  return status::success();
}

status host_unsorted_segment_sum(const tensor& data, const tensor& segment_ids,
                                 int64_t num_segments, tensor& out) {
  shape_type shape;
  if (auto st = segment_sum_shape(data.shape(), segment_ids.shape(), num_segments, shape); !st.ok())
    return st;
  const size_t row = row_elements(data.shape(), segment_ids.shape().size());
  // num_segments is a value: bounded before the result is allocated.
  if (auto st = check_result_rows("unsorted_segment_sum", "num_segments", num_segments, row,
                                  data.type());
      !st.ok())
    return st;
  if (auto st = check_ids(segment_ids, num_segments, "segment_ids", true); !st.ok())
    return status::failure("unsorted_segment_sum: " + st.error, st.what);
  tensor result = tensor::filled(data.type(), shape, 0);
  with_type(data.type(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = data.data<T>();
    T* o = result.mutable_data<T>();
    for (size_t i = 0; i < segment_ids.num_elements(); ++i) {
      auto s = integer_at(segment_ids, i);
      if (s < 0)
        continue; // dropped, as TensorFlow does
      T* dst = o + static_cast<size_t>(s) * row;
      for (size_t k = 0; k < row; ++k)
        dst[k] = accumulate(scatter_op::add, dst[k], in[i * row + k]);
    }
  });
  out = std::move(result);
  return status::success();
}

status host_unique(const tensor& x, tensor* y, tensor* idx) {
  if (!is_id_type(x.type()) || x.shape().size() != 1)
    return status::shape("unique takes a 1-D int32 or int64 tensor, got " + x.summary());
  const size_t n = x.num_elements();
  if (n > static_cast<size_t>(INT32_MAX))
    return status::failure("unique: " + std::to_string(n)
                           + " ids do not fit int32 inverse indices");
  // A ps dedups every sparse gradient it applies (actors/variable.cpp): a
  // thread's table is kept for its next call (no allocation per id, nor
  // per call once warm), unless the call is too large to keep its table.
  constexpr size_t kept_ids = size_t{1} << 16;
  thread_local id_dedup kept;
  id_dedup once;
  id_dedup& first = n <= kept_ids ? kept : once; // value -> its index in y
  first.reset(n);
  std::vector<int64_t> values;
  values.reserve(n);
  tensor inverse{dtype::int32, x.shape()};
  int32_t* inv = inverse.mutable_data<int32_t>();
  each_id(x, [&](size_t i, int64_t v) {
    auto [at, fresh] = first.insert(v);
    if (fresh)
      values.push_back(v);
    inv[i] = at;
    return true;
  });
  if (y != nullptr) {
    tensor distinct{x.type(), {static_cast<int64_t>(values.size())}};
    for (size_t k = 0; k < values.size(); ++k) {
      if (x.type() == dtype::int32)
        distinct.mutable_data<int32_t>()[k] = static_cast<int32_t>(values[k]);
      else
        distinct.mutable_data<int64_t>()[k] = values[k];
    }
    *y = std::move(distinct);
  }
  if (idx != nullptr)
    *idx = std::move(inverse);
  return status::success();
}

const char* to_string(scatter_op op) {
  switch (op) {
    case scatter_op::add: return "scatter_add";
    case scatter_op::sub: return "scatter_sub";
    case scatter_op::update: return "scatter_update";
  }
  return "scatter";
}

std::optional<scatter_op> parse_scatter_op(std::string_view name) {
  for (auto op : {scatter_op::add, scatter_op::sub, scatter_op::update})
    if (name == to_string(op))
      return op;
  return std::nullopt;
}

status host_scatter(scatter_op op, tensor& ref, const tensor& indices, const tensor& updates) {
  if (ref.empty() || ref.shape().empty())
    return status::shape("the variable must have at least one dimension, got "
                         + (ref.empty() ? std::string{"no value"} : ref.summary()));
  if (updates.type() != ref.type())
    return status::dtype("updates have dtype " + std::string{dtype_name(updates.type())}
                         + ", the variable has " + dtype_name(ref.type()));
  shape_type want; // the updates' shape: given, not allocated, so not bounded as a gather's
  if (auto st = gather_dims(ref.shape(), indices.shape(), indices.type(), want); !st.ok())
    return st;
  bool scalar = updates.num_elements() == 1 && updates.shape().empty();
  if (updates.shape() != want && !scalar)
    return status::shape("updates have shape " + shape_string(updates.shape()) + ", need "
                         + shape_string(want) + " (indices' shape + the variable's row shape)");
  // Every id before the first write: a refused scatter changes nothing.
  if (auto st = check_ids(indices, ref.shape()[0], "indices"); !st.ok())
    return st;
  const size_t row = row_elements(ref.shape(), 1);
  with_type(ref.type(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = updates.data<T>();
    T* o = ref.mutable_data<T>(); // copies first if a reader holds the buffer
    each_id(indices, [&](size_t i, int64_t id) { // in order: the last update wins
      T* dst = o + static_cast<size_t>(id) * row;
      for (size_t k = 0; k < row; ++k) {
        T v = in[scalar ? 0 : i * row + k];
        dst[k] = op == scatter_op::update ? v : accumulate(op, dst[k], v);
      }
      return true;
    });
  });
  return status::success();
}

} // namespace af::kernels
