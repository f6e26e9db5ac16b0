// The op registry (kernels/op_registry.hpp): the one table of graph ops, and
// run_op / known_op / infer_op, which read it. Each op's backend entry and
// shape rule are small functions here; the kernel bodies are the backends'.
#include "kernels/op_registry.hpp"
#include "kernels/partition_ops.hpp"
#include "kernels/shard_routing.hpp"
#include "kernels/sparse.hpp"
#include "kernels/array_ops.hpp"
#include "kernels/host_helpers.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace af::kernels {

namespace {

using op_inputs = std::vector<tensor>;
using infos = std::vector<value_info>;

// -- backend entries ------------------------------------------------------------

template <binary_op Op>
status binary_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.binary(Op, in[0], in[1], out);
}

template <unary_op Op>
status unary_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.unary(Op, in[0], out);
}

template <reduce_op Op>
status reduce_kernel(backend& b, const op_attrs& attrs, const op_inputs& in, tensor& out) {
  return b.reduce(Op, attrs, in[0], out);
}

template <bool Log>
status softmax_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.softmax(in[0], Log, out);
}

template <bool Log>
status softmax_grad_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.softmax_grad(in[0], in[1], Log, out);
}

status matmul_kernel(backend& b, const op_attrs& attrs, const op_inputs& in, tensor& out) {
  return b.matmul(in[0], in[1], attrs.transpose_a, attrs.transpose_b, out);
}

status sum_to_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.sum_to(in[0], in[1], out);
}

status softmax_xent_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.softmax_xent(in[0], in[1], out);
}

status softmax_xent_grad_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.softmax_xent_grad(in[0], in[1], in[2], out);
}

/// (dy, x) for sum and mean, (dy, x, y) for max.
template <reduce_op Op>
status reduce_grad_kernel(backend& b, const op_attrs& attrs, const op_inputs& in, tensor& out) {
  return b.reduce_grad(Op, attrs, in[0], in[1], Op == reduce_op::max ? in[2] : tensor{}, out);
}

/// (logits [batch, classes], labels [batch]): how many argmax == label. On
/// the host whatever the backend: it is one number per step.
status correct_count_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  const tensor& logits = in[0];
  const tensor& labels = in[1];
  if (logits.type() != dtype::float32 || logits.shape().size() != 2)
    return status::shape("correct_count takes float32 logits [batch, classes], got "
                         + logits.summary());
  if ((labels.type() != dtype::int32 && labels.type() != dtype::int64)
      || labels.shape() != shape_type{logits.shape()[0]})
    return status::shape("correct_count: labels " + labels.summary()
                         + " must be int32 or int64 [batch] matching logits " + logits.summary());
  auto rows = static_cast<size_t>(logits.shape()[0]);
  auto cols = static_cast<size_t>(logits.shape()[1]);
  const float* x = logits.data<float>();
  double hits = 0;
  for (size_t r = 0; r < rows; ++r) {
    size_t best = 0;
    for (size_t c = 1; c < cols; ++c)
      if (x[r * cols + c] > x[r * cols + best])
        best = c;
    hits += static_cast<int64_t>(best) == integer_at(labels, r) ? 1 : 0;
  }
  out = tensor::filled(dtype::float32, {}, hits);
  return status::success();
}

/// The seed of gradients: the loss's dtype and shape, all ones.
status ones_like_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  out = tensor::filled(in[0].type(), in[0].shape(), 1);
  return status::success();
}

status gather_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.gather(in[0], in[1], out);
}

/// (data, segment_ids, num_segments): the count is a value, read on the host.
status unsorted_segment_sum_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  int64_t segments = 0;
  if (auto st = read_num_segments(in[2], segments); !st.ok())
    return st;
  return b.unsorted_segment_sum(in[0], in[1], segments, out);
}

/// (dy, params, indices): dy's rows summed into params' rows, densely (rows
/// no id names get zeros; a sparse gradient value is issue 25's next step).
status gather_grad_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  const tensor &dy = in[0], &params = in[1], &indices = in[2];
  shape_type gathered;
  if (auto st = check_gather(params, indices, gathered); !st.ok())
    return st;
  if (dy.shape() != gathered || dy.type() != params.type())
    return status::shape("gather_grad: dy " + dy.summary() + " is not the gather of "
                         + params.summary() + " by " + indices.summary());
  return b.unsorted_segment_sum(dy, indices, params.shape()[0], out);
}

/// tf.unique's two outputs as two ops, one output each (a graph node has
/// one): `unique` is y, `unique_idx` is idx. On the host whatever the backend.
template <bool Inverse>
status unique_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  return Inverse ? host_unique(in[0], nullptr, &out) : host_unique(in[0], &out, nullptr);
}

// The array ops of sparse gradients (kernels/array_ops.hpp), on the host.
status concat_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  return host_concat(in[0], in[1], out);
}

// Partitioned tables (kernels/partition_ops.hpp, kernels/shard_routing.hpp):
// on the host whatever the backend, as unique is: ids and row copies.

/// (data, partitions, num_partitions, partition): the last two int scalars
/// (tensors, not attributes, as unsorted_segment_sum's count: op_attrs
/// travels on the wire and has no field for them).
status dynamic_partition_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  const char* names[] = {"num_partitions", "partition"};
  int32_t values[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const tensor& t = in[static_cast<size_t>(2 + k)];
    if ((t.type() != dtype::int32 && t.type() != dtype::int64) || t.num_elements() != 1)
      return status::failure(std::string{"dynamic_partition: "} + names[k]
                             + " must be one int32 or int64, got " + t.summary());
    auto v = integer_at(t, 0);
    if (v < 0 || v > INT32_MAX)
      return status::failure(std::string{"dynamic_partition: "} + names[k] + " = "
                             + std::to_string(v) + " is not in [0, 2^31)");
    values[k] = static_cast<int32_t>(v);
  }
  return host_dynamic_partition(in[0], in[1], values[0], values[1], out);
}

/// (indices_0 .. indices_n-1, data_0 .. data_n-1).
status dynamic_stitch_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  auto half = static_cast<long>(in.size() / 2);
  return host_dynamic_stitch(std::vector<tensor>(in.begin(), in.begin() + half),
                             std::vector<tensor>(in.begin() + half, in.end()), out);
}

/// (ids, shard_rows, strategy): strategy an int scalar, a partition_strategy.
template <bool Row>
status route_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  const char* op = Row ? "row_in_shard" : "shard_of";
  const std::string allowed = ": 0 (mod), 1 (div) or 2 (contiguous)";
  if (!is_id_type(in[2].type()) || in[2].num_elements() != 1)
    return status::failure(std::string{op} + ": STRATEGY must be one int" + allowed + ", got "
                           + in[2].summary());
  const int64_t strategy = integer_at(in[2], 0);
  if (strategy < 0 || strategy > static_cast<int64_t>(partition_strategy::contiguous))
    return status::failure(std::string{op} + ": STRATEGY = " + std::to_string(strategy)
                           + " is not a partition strategy" + allowed);
  return host_route(in[0], in[1], static_cast<partition_strategy>(strategy), Row, out);
}

status size_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  return host_size(in[0], out);
}

status flatten_rows_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  return host_flatten_rows(in[0], in[1], out);
}

status range_kernel(backend&, const op_attrs&, const op_inputs& in, tensor& out) {
  return host_range(in[0], out);
}

// -- shape rules ------------------------------------------------------------------

bool is_float(dtype t) {
  return t == dtype::float32 || t == dtype::float64;
}

std::string describe(const value_info& v) {
  return std::string{dtype_name(v.type)} + shape_string(v.shape);
}

status need_float(const char* op, const value_info& v) {
  if (!is_float(v.type))
    return status::dtype(std::string{op} + " takes float32 or float64, got " + dtype_name(v.type));
  return status::success();
}

/// Elementwise with NumPy broadcasting: add, sub, mul, div.
status broadcast_rule(const op_attrs&, const infos& in, value_info& out) {
  if (in[0].type != in[1].type)
    return status::dtype("dtypes differ: " + describe(in[0]) + " vs " + describe(in[1]));
  auto shape = broadcast_shapes(in[0].shape, in[1].shape);
  if (!shape)
    return status::shape("shapes " + shape_string(in[0].shape) + " and "
                         + shape_string(in[1].shape) + " do not broadcast");
  out = {in[0].type, *shape};
  return status::success();
}

/// (dy, x) or (dy, y) of one shape and dtype: the elementwise gradient ops.
status same_shape_rule(const op_attrs&, const infos& in, value_info& out) {
  if (in[0].type != in[1].type || in[0].shape != in[1].shape)
    return status::shape("needs equal shapes and dtypes, got " + describe(in[0]) + " and "
                         + describe(in[1]));
  out = in[0];
  return status::success();
}

/// A float function applied elementwise.
status float_unary_rule(const op_attrs&, const infos& in, value_info& out) {
  if (auto st = need_float("an elementwise function", in[0]); !st.ok())
    return st;
  out = in[0];
  return status::success();
}

status like_first_rule(const op_attrs&, const infos& in, value_info& out) {
  out = in[0];
  return status::success();
}

status like_second_rule(const op_attrs&, const infos& in, value_info& out) {
  out = {in[0].type, in[1].shape};
  return status::success();
}

status matmul_rule(const op_attrs& attrs, const infos& in, value_info& out) {
  const auto &a = in[0], &b = in[1];
  if (a.type != b.type)
    return status::dtype("matmul: dtypes differ: " + describe(a) + " vs " + describe(b));
  if (auto st = need_float("matmul", a); !st.ok())
    return st;
  if (a.shape.size() != 2 || b.shape.size() != 2)
    return status::shape("matmul takes 2-D tensors, got " + shape_string(a.shape) + " and "
                         + shape_string(b.shape));
  auto rows = a.shape[attrs.transpose_a ? 1 : 0], inner_a = a.shape[attrs.transpose_a ? 0 : 1];
  auto inner_b = b.shape[attrs.transpose_b ? 1 : 0], cols = b.shape[attrs.transpose_b ? 0 : 1];
  if (inner_a != inner_b)
    return status::shape("matmul: inner dimensions differ: " + shape_string(a.shape) + " and "
                         + shape_string(b.shape));
  out = {a.type, {rows, cols}};
  return status::success();
}

status reduce_rule(const op_attrs& attrs, const infos& in, value_info& out) {
  if (auto st = need_float("a reduction", in[0]); !st.ok())
    return st;
  out.type = in[0].type;
  return reduced_shape(in[0].shape, attrs, out.shape);
}

/// (dy, x[, y]): dy spread back over x.
status reduce_grad_rule(const op_attrs& attrs, const infos& in, value_info& out) {
  shape_type reduced;
  if (auto st = reduced_shape(in[1].shape, attrs, reduced); !st.ok())
    return st;
  if (num_elements(in[0].shape) != num_elements(reduced) || in[0].type != in[1].type)
    return status::shape("reduce gradient: dy " + describe(in[0])
                         + " does not match the reduction of " + describe(in[1]));
  out = in[1];
  return status::success();
}

status softmax_rule(const op_attrs&, const infos& in, value_info& out) {
  if (auto st = need_float("softmax", in[0]); !st.ok())
    return st;
  if (in[0].shape.empty())
    return status::shape("softmax needs at least one dimension, got a scalar");
  out = in[0];
  return status::success();
}

/// (logits [batch, classes], integer labels [batch]) -> [batch] of `type`.
status labelled_rule(const char* op, const value_info& logits, const value_info& labels,
                     dtype type, shape_type shape, value_info& out) {
  if (!is_float(logits.type) || logits.shape.size() != 2)
    return status::shape(std::string{op} + " takes float logits [batch, classes], got "
                         + describe(logits));
  if (!is_id_type(labels.type) || labels.shape != shape_type{logits.shape[0]})
    return status::shape(std::string{op} + ": labels " + describe(labels)
                         + " must be int32 or int64 [batch] matching logits " + describe(logits));
  out = {type, std::move(shape)};
  return status::success();
}

status softmax_xent_rule(const op_attrs&, const infos& in, value_info& out) {
  return labelled_rule("softmax_xent", in[0], in[1], in[0].type, {in[0].shape.empty() ? 0 : in[0].shape[0]}, out);
}

/// (dy [batch], logits, labels) -> logits' shape.
status softmax_xent_grad_rule(const op_attrs&, const infos& in, value_info& out) {
  if (auto st = labelled_rule("softmax_xent_grad", in[1], in[2], in[1].type, in[1].shape, out);
      !st.ok())
    return st;
  if (in[0].type != in[1].type || in[0].shape != shape_type{in[1].shape[0]})
    return status::shape("softmax_xent gradient: dy " + describe(in[0])
                         + " does not match logits " + describe(in[1]));
  return status::success();
}

status correct_count_rule(const op_attrs&, const infos& in, value_info& out) {
  if (in[0].type != dtype::float32)
    return status::shape("correct_count takes float32 logits [batch, classes], got "
                         + describe(in[0]));
  return labelled_rule("correct_count", in[0], in[1], dtype::float32, {}, out);
}

status gather_rule(const op_attrs&, const infos& in, value_info& out) {
  out.type = in[0].type;
  return gather_shape(in[0].shape, in[0].type, in[1].shape, in[1].type, out.shape);
}

/// (dy, params, indices) -> params' dtype and shape.
status gather_grad_rule(const op_attrs&, const infos& in, value_info& out) {
  shape_type gathered;
  if (auto st = gather_shape(in[1].shape, in[1].type, in[2].shape, in[2].type, gathered); !st.ok())
    return st;
  if (in[0].shape != gathered || in[0].type != in[1].type)
    return status::shape("dy " + describe(in[0]) + " is not the gather of " + describe(in[1])
                         + " by " + describe(in[2]));
  out = in[1];
  return status::success();
}

/// (data, segment_ids, num_segments) -> [?] + data.shape[rank(segment_ids):].
status unsorted_segment_sum_rule(const op_attrs&, const infos& in, value_info& out) {
  if (!is_id_type(in[1].type) || !is_id_type(in[2].type) || num_elements(in[2].shape) != 1)
    return status::dtype("segment_ids must be int32 or int64 and num_segments one int32 or "
                         "int64, got " + describe(in[1]) + " and " + describe(in[2]));
  out.type = in[0].type;
  return segment_sum_shape(in[0].shape, in[1].shape, unknown_dim, out.shape);
}

/// A 1-D int32 or int64 tensor -> y [?] of its dtype, or idx of its shape in int32.
template <bool Inverse>
status unique_rule(const op_attrs&, const infos& in, value_info& out) {
  if (!is_id_type(in[0].type) || in[0].shape.size() != 1)
    return status::shape("unique takes a 1-D int32 or int64 tensor, got " + describe(in[0]));
  out = Inverse ? value_info{dtype::int32, in[0].shape} : value_info{in[0].type, {unknown_dim}};
  return status::success();
}

/// (a, b) -> a's rows then b's.
status concat_rule(const op_attrs&, const infos& in, value_info& out) {
  out.type = in[0].type;
  return concat_shape(in[0].shape, in[0].type, in[1].shape, in[1].type, out.shape);
}

/// (data, partitions, num_partitions, partition) -> [?] + data.shape[rank(partitions):].
status dynamic_partition_rule(const op_attrs&, const infos& in, value_info& out) {
  if (!is_id_type(in[1].type) || !is_id_type(in[2].type) || !is_id_type(in[3].type)
      || num_elements(in[2].shape) != 1 || num_elements(in[3].shape) != 1)
    return status::dtype("partitions must be int32 or int64, num_partitions and partition one "
                         "int each, got " + describe(in[1]) + ", " + describe(in[2]) + " and "
                         + describe(in[3]));
  const auto &d = in[0].shape, &p = in[1].shape;
  if (p.size() > d.size() || !std::equal(p.begin(), p.end(), d.begin()))
    return status::shape("partitions " + describe(in[1]) + " must have a prefix of data's shape "
                         + describe(in[0]));
  out = {in[0].type, {unknown_dim}};
  out.shape.insert(out.shape.end(), d.begin() + static_cast<long>(p.size()), d.end());
  return status::success();
}

/// (indices..., data...) -> [?] + the slice shape, data[0]'s dtype.
status dynamic_stitch_rule(const op_attrs&, const infos& in, value_info& out) {
  const size_t n = in.size() / 2;
  const auto &i0 = in[0].shape, &d0 = in[n].shape;
  if (i0.size() > d0.size())
    return status::shape("data[0] " + describe(in[n]) + " does not start with indices[0]'s shape");
  shape_type slice(d0.begin() + static_cast<long>(i0.size()), d0.end());
  for (size_t m = 0; m < n; ++m) {
    auto want = in[m].shape;
    want.insert(want.end(), slice.begin(), slice.end());
    if (!is_id_type(in[m].type) || in[n + m].type != in[n].type || in[n + m].shape != want)
      return status::shape("indices[" + std::to_string(m) + "] " + describe(in[m]) + " and data["
                           + std::to_string(m) + "] " + describe(in[n + m])
                           + " do not fit (int indices, data = indices' shape + the slice shape)");
  }
  out = {in[n].type, {unknown_dim}};
  out.shape.insert(out.shape.end(), slice.begin(), slice.end());
  return status::success();
}

/// (ids, shard_rows) -> int32 shards (Row false) or rows in ids' dtype, ids' shape.
template <bool Row>
status route_rule(const op_attrs&, const infos& in, value_info& out) {
  if (!is_id_type(in[0].type) || !is_id_type(in[1].type) || in[1].shape.size() != 1
      || !is_id_type(in[2].type) || num_elements(in[2].shape) != 1)
    return status::dtype("takes int ids, 1-D int SHARD_ROWS and one int STRATEGY, got "
                         + describe(in[0]) + ", " + describe(in[1]) + " and " + describe(in[2]));
  out = {Row ? in[0].type : dtype::int32, in[0].shape};
  return status::success();
}

status size_rule(const op_attrs&, const infos&, value_info& out) {
  out = {dtype::int32, {}};
  return status::success();
}

/// (x, ids) -> [size(ids)] + x.shape[rank(ids):].
status flatten_rows_rule(const op_attrs&, const infos& in, value_info& out) {
  out.type = in[0].type;
  return flatten_rows_shape(in[0].shape, in[1].shape, out.shape);
}

status range_rule(const op_attrs&, const infos& in, value_info& out) {
  if (!is_id_type(in[0].type) || num_elements(in[0].shape) != 1)
    return status::dtype("range takes one int32 or int64 limit, got " + describe(in[0]));
  out = {dtype::int32, {unknown_dim}};
  return status::success();
}

// -- the table ----------------------------------------------------------------------

constexpr auto none = op_attr_kind::none;
constexpr auto reduction = op_attr_kind::reduction;
constexpr auto rule = op_gradient::rule;
constexpr auto no_gradient = op_gradient::none;

// The only list of op names: a name is either run by its own kernel or
// rejected, never sent to another op's kernel. Forward ops first: the REPL
// lists them in this order.
const op_def table[] = {
  // name, inputs, attrs, shape rule, backend entry, gradient, function, help
  {"add", "A, B", none, broadcast_rule, binary_kernel<binary_op::add>, rule, "",
   "A + B elementwise, NumPy broadcasting (also A + B)"},
  {"sub", "A, B", none, broadcast_rule, binary_kernel<binary_op::sub>, rule, "",
   "A - B elementwise, NumPy broadcasting (also A - B)"},
  {"mul", "A, B", none, broadcast_rule, binary_kernel<binary_op::mul>, rule, "",
   "A * B elementwise, NumPy broadcasting (also A * B)"},
  {"div", "A, B", none, broadcast_rule, binary_kernel<binary_op::div>, rule, "",
   "A / B elementwise, NumPy broadcasting (also A / B); an integer x / 0 is 0"},
  {"neg", "X", none, float_unary_rule, unary_kernel<unary_op::neg>, rule, "", "-X (also -X)"},
  {"exp", "X", none, float_unary_rule, unary_kernel<unary_op::exp>, rule, "", "e to the X, elementwise"},
  {"log", "X", none, float_unary_rule, unary_kernel<unary_op::log>, rule, "",
   "the natural logarithm of X, elementwise"},
  {"relu", "X", none, float_unary_rule, unary_kernel<unary_op::relu>, rule, "", "max(X, 0) elementwise"},
  {"sigmoid", "X", none, float_unary_rule, unary_kernel<unary_op::sigmoid>, rule, "",
   "1 / (1 + e^-X) elementwise"},
  {"tanh", "X", none, float_unary_rule, unary_kernel<unary_op::tanh>, rule, "", "tanh(X) elementwise"},
  {"square", "X", none, float_unary_rule, unary_kernel<unary_op::square>, rule, "", "X * X elementwise"},
  {"sqrt", "X", none, float_unary_rule, unary_kernel<unary_op::sqrt>, rule, "",
   "the square root of X, elementwise"},
  {"softplus", "X", none, float_unary_rule, unary_kernel<unary_op::softplus>, rule, "",
   "log(1 + e^X) elementwise, computed stably: a smooth relu"},
  {"matmul", "A, B", op_attr_kind::transposes, matmul_rule, matmul_kernel, rule, "",
   "the matrix product of 2-D A and B, either transposed first (also A @ B)"},
  {"sum", "X", reduction, reduce_rule, reduce_kernel<reduce_op::sum>, rule, "reduce_sum",
   "the sum of X over all axes, or over `axis` (negative: from the end)"},
  {"mean", "X", reduction, reduce_rule, reduce_kernel<reduce_op::mean>, rule, "reduce_mean",
   "the mean of X over all axes, or over `axis`"},
  {"max", "X", reduction, reduce_rule, reduce_kernel<reduce_op::max>, rule, "reduce_max",
   "the largest element of X over all axes, or over `axis`"},
  {"softmax", "LOGITS", none, softmax_rule, softmax_kernel<false>, rule, "",
   "softmax over the last axis"},
  {"log_softmax", "LOGITS", none, softmax_rule, softmax_kernel<true>, rule, "",
   "log(softmax(LOGITS)) over the last axis, computed stably"},
  {"softmax_xent", "LOGITS, LABELS", none, softmax_xent_rule, softmax_xent_kernel, rule, "",
   "per-example cross-entropy of LOGITS [batch, classes] and int LABELS [batch]"},
  {"correct_count", "LOGITS, LABELS", none, correct_count_rule, correct_count_kernel, no_gradient,
   "", "how many rows of float32 LOGITS have their largest entry at LABELS (a float32 scalar)"},
  {"gather", "PARAMS, INDICES", none, gather_rule, gather_kernel, rule, "",
   "rows INDICES (int32/int64, any rank) of PARAMS along axis 0 (tf.gather, embedding_lookup); "
   "an id out of range is an error naming it"},
  {"unique", "X", none, unique_rule<false>, unique_kernel<false>, no_gradient, "",
   "the distinct values of 1-D int X in the order they first occur (tf.unique's y)"},
  {"unique_idx", "X", none, unique_rule<true>, unique_kernel<true>, no_gradient, "",
   "int32 idx with X[i] == unique(X)[idx[i]] (tf.unique's idx)"},
  {"unsorted_segment_sum", "DATA, SEGMENT_IDS, NUM_SEGMENTS", none, unsorted_segment_sum_rule,
   unsorted_segment_sum_kernel, no_gradient, "",
   "rows of DATA summed by SEGMENT_IDS into NUM_SEGMENTS rows; negative ids dropped, ids >= "
   "NUM_SEGMENTS refused"},
  // The array ops of sparse gradients (graph/gradients.cpp, docs/sparse.md).
  {"concat", "A, B", none, concat_rule, concat_kernel, no_gradient, "",
   "A's rows then B's (tf.concat on axis 0): one dtype, shapes equal after the first dimension"},
  {"flatten_rows", "X, IDS", none, flatten_rows_rule, flatten_rows_kernel, no_gradient, "",
   "X, whose shape starts with IDS', with those dimensions merged into one: [size(IDS)] + "
   "X.shape[rank(IDS):] (a gather's gradient rows)"},
  // Partitioned tables (graph/embedding.hpp builds them into a lookup).
  {"dynamic_partition", "DATA, PARTITIONS, NUM_PARTITIONS, PARTITION", none,
   dynamic_partition_rule, dynamic_partition_kernel, no_gradient, "",
   "output PARTITION of tf.dynamic_partition: the slices of DATA whose PARTITIONS id is PARTITION, "
   "in order; ids out of [0, NUM_PARTITIONS) refused"},
  {"dynamic_stitch", "INDICES, DATA", none, dynamic_stitch_rule, dynamic_stitch_kernel, rule, "",
   "tf.dynamic_stitch(N indices, then N data): merged[INDICES[m][i]] = DATA[m][i], later ones "
   "overwrite earlier", true},
  {"shard_of", "IDS, SHARD_ROWS, STRATEGY", none, route_rule<false>, route_kernel<false>,
   no_gradient, "",
   "the shard (int32) of each id of a table of shards SHARD_ROWS rows each, STRATEGY 0 mod, 1 div, "
   "2 contiguous; an id out of the table refused"},
  {"row_in_shard", "IDS, SHARD_ROWS, STRATEGY", none, route_rule<true>, route_kernel<true>,
   no_gradient, "", "the row of each id within its shard (see shard_of)"},
  {"size", "X", none, size_rule, size_kernel, no_gradient, "",
   "the number of elements of X, an int32 scalar (tf.size)"},
  {"range", "LIMIT", none, range_rule, range_kernel, no_gradient, "",
   "0, 1, ..., LIMIT - 1 as int32 (tf.range of an int scalar LIMIT)"},
  // Gradient ops: what gradients() adds; callable like any op.
  {"relu_grad", "DY, X", none, same_shape_rule, binary_kernel<binary_op::relu_grad>, no_gradient,
   "", "the gradient of relu: DY where X > 0, else 0"},
  {"sigmoid_grad", "DY, Y", none, same_shape_rule, binary_kernel<binary_op::sigmoid_grad>,
   no_gradient, "", "the gradient of sigmoid from its output Y: DY * Y * (1 - Y)"},
  {"tanh_grad", "DY, Y", none, same_shape_rule, binary_kernel<binary_op::tanh_grad>, no_gradient,
   "", "the gradient of tanh from its output Y: DY * (1 - Y^2)"},
  {"sum_to", "DY, LIKE", none, like_second_rule, sum_to_kernel, no_gradient, "",
   "DY summed over the dimensions that broadcasting added to LIKE's shape"},
  {"softmax_grad", "DY, Y", none, same_shape_rule, softmax_grad_kernel<false>, no_gradient, "",
   "the gradient of softmax from its output Y"},
  {"log_softmax_grad", "DY, Y", none, same_shape_rule, softmax_grad_kernel<true>, no_gradient, "",
   "the gradient of log_softmax from its output Y"},
  {"softmax_xent_grad", "DY, LOGITS, LABELS", none, softmax_xent_grad_rule,
   softmax_xent_grad_kernel, no_gradient, "",
   "the gradient of softmax_xent w.r.t. LOGITS: DY[:, None] * (softmax(LOGITS) - onehot(LABELS))"},
  {"sum_grad", "DY, X", reduction, reduce_grad_rule, reduce_grad_kernel<reduce_op::sum>,
   no_gradient, "", "the gradient of sum: DY spread over X's shape"},
  {"mean_grad", "DY, X", reduction, reduce_grad_rule, reduce_grad_kernel<reduce_op::mean>,
   no_gradient, "", "the gradient of mean: DY / count spread over X's shape"},
  {"max_grad", "DY, X, Y", reduction, reduce_grad_rule, reduce_grad_kernel<reduce_op::max>,
   no_gradient, "", "the gradient of max: DY where X equals the forward output Y"},
  {"gather_grad", "DY, PARAMS, INDICES", none, gather_grad_rule, gather_grad_kernel, no_gradient,
   "", "gather's sparse gradient densified: DY's rows summed into PARAMS' rows by INDICES"},
  {"ones_like", "X", none, like_first_rule, ones_like_kernel, no_gradient, "",
   "ones of X's dtype and shape (the seed of gradients)"},
};

} // namespace

std::string op_def::signature() const {
  std::string out{call_name()};
  std::string names{inputs};
  if (variadic) { // "INDICES..., DATA...": each input as many times as the others
    std::string each;
    for (char c : names)
      each += c == ',' ? std::string{"...,"} : std::string(1, c);
    names = each + "...";
  }
  out += "(" + names;
  if (attrs == op_attr_kind::transposes)
    out += ", transpose_a=false, transpose_b=false";
  else if (attrs == op_attr_kind::reduction)
    out += ", axis=all, keep_dims=false";
  return out + ")";
}

const std::vector<op_def>& op_registry() {
  static const std::vector<op_def> all(std::begin(table), std::end(table));
  return all;
}

const op_def* find_op_def(std::string_view name) {
  for (const auto& e : op_registry())
    if (e.name == name || (!e.function.empty() && e.function == name))
      return &e;
  return nullptr;
}

namespace {

/// The op under its graph name only: executors never see a builder name.
/// The array itself, not op_registry()'s copy: no static guard on the
/// executors' path.
const op_def* find_graph_op(std::string_view name) {
  for (const auto& e : table)
    if (e.name == name)
      return &e;
  return nullptr;
}

} // namespace

bool known_op(const std::string& op) {
  return find_graph_op(op) != nullptr;
}

status run_op(backend& b, const std::string& op, const op_attrs& attrs,
              const std::vector<tensor>& in, tensor& out) {
  const auto* entry = find_graph_op(op);
  if (entry == nullptr)
    return status::failure("unknown op '" + op + "'");
  if (!entry->takes(in.size()))
    return status::failure(op + " takes " + std::to_string(entry->arity())
                           + (entry->variadic ? " input(s) or a multiple" : " input(s)") + ", got "
                           + std::to_string(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].empty())
      return status::failure(op + ": input " + std::to_string(i) + " has no value");
  return entry->run(b, attrs, in, out);
}

status infer_op(const std::string& op, const op_attrs& attrs, const std::vector<value_info>& in,
                value_info& out) {
  const auto* entry = find_graph_op(op);
  if (entry == nullptr)
    return status::failure("unknown op '" + op + "'");
  if (!entry->takes(in.size()))
    return status::failure(op + " takes " + std::to_string(entry->arity())
                           + (entry->variadic ? " input(s) or a multiple" : " input(s)") + ", got "
                           + std::to_string(in.size()));
  auto st = entry->shape(attrs, in, out);
  if (!st.ok() && st.error.rfind(op, 0) != 0)
    st.error = op + ": " + st.error; // every failure names its op
  return st;
}

} // namespace af::kernels
