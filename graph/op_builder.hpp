#pragma once
/// The typed builder methods (g.add(a, b), s->matmul(x, w), reduce_mean(x,
/// 1), ...), written once for both builders: af::graph (graph/graph.hpp) and
/// af::session (actors/session.hpp) derive from op_builder<themselves> and
/// supply `op(kind, inputs, attrs, name)`. Each method is a one-line wrapper
/// of an op of the registry (kernels/op_registry.hpp), which is where an op's
/// inputs, attributes, shape rule, kernels and help are; `op("name", ...)`
/// builds any registered op without a method here.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/op_attrs.hpp"

namespace af {

/// A node of the graph (TF's Tensor / Operation handle).
struct output {
  int32_t id = -1;
  bool valid() const { return id >= 0; }
  bool operator==(output other) const { return id == other.id; }
  bool operator!=(output other) const { return id != other.id; }
  bool operator<(output other) const { return id < other.id; }
};

/// tf.unique's two outputs: y, the distinct values in the order they first
/// occur, and idx (int32), with x[i] == y[idx[i]].
struct unique_outputs {
  output y;
  output idx;
};

/// The attributes of a reduction over all axes, or over `axis` when given.
inline op_attrs reduction_attrs(std::optional<int32_t> axis, bool keep_dims) {
  op_attrs attrs;
  attrs.all_axes = !axis.has_value();
  attrs.axis = axis.value_or(0);
  attrs.keep_dims = keep_dims;
  return attrs;
}

/// The builder methods of `Builder`, which has
/// `output op(const std::string&, std::vector<output>, op_attrs, const std::string&)`.
template <class Builder>
class op_builder {
public:
  output add(output a, output b, const std::string& name = "add") { return build("add", {a, b}, {}, name); }
  output sub(output a, output b, const std::string& name = "sub") { return build("sub", {a, b}, {}, name); }
  output mul(output a, output b, const std::string& name = "mul") { return build("mul", {a, b}, {}, name); }
  output div(output a, output b, const std::string& name = "div") { return build("div", {a, b}, {}, name); }
  output neg(output x) { return build("neg", {x}); }
  output exp(output x) { return build("exp", {x}); }
  output log(output x) { return build("log", {x}); }
  output relu(output x) { return build("relu", {x}); }
  output sigmoid(output x) { return build("sigmoid", {x}); }
  output tanh(output x) { return build("tanh", {x}); }
  output square(output x) { return build("square", {x}); }
  output sqrt(output x) { return build("sqrt", {x}); }
  output softplus(output x) { return build("softplus", {x}); }
  output matmul(output a, output b, bool transpose_a = false, bool transpose_b = false,
                const std::string& name = "matmul") {
    op_attrs attrs;
    attrs.transpose_a = transpose_a;
    attrs.transpose_b = transpose_b;
    return build("matmul", {a, b}, attrs, name);
  }
  /// Reductions over all axes, or over `axis` when given (negative: from the end).
  output reduce_sum(output x, std::optional<int32_t> axis = std::nullopt, bool keep_dims = false) {
    return build("sum", {x}, reduction_attrs(axis, keep_dims));
  }
  output reduce_mean(output x, std::optional<int32_t> axis = std::nullopt, bool keep_dims = false) {
    return build("mean", {x}, reduction_attrs(axis, keep_dims));
  }
  output reduce_max(output x, std::optional<int32_t> axis = std::nullopt, bool keep_dims = false) {
    return build("max", {x}, reduction_attrs(axis, keep_dims));
  }
  output softmax(output logits) { return build("softmax", {logits}); }
  output log_softmax(output logits) { return build("log_softmax", {logits}); }
  /// Per-example loss of logits [batch, classes] and int labels [batch].
  output softmax_xent(output logits, output labels, const std::string& name = "softmax_xent") {
    return build("softmax_xent", {logits, labels}, {}, name);
  }

  /// Rows `indices` (int32 or int64, any rank) of `params` along axis 0
  /// (tf.gather): indices.shape + params.shape[1:]. An id out of range is an
  /// error naming it when the step runs.
  output gather(output params, output indices, const std::string& name = "gather") {
    return build("gather", {params, indices}, {}, name);
  }
  /// tf.nn.embedding_lookup of one (unpartitioned) table: gather by its TF name.
  output embedding_lookup(output params, output ids, const std::string& name = "embedding_lookup") {
    return build("gather", {params, ids}, {}, name);
  }
  /// tf.unique of a 1-D int32 or int64 tensor: two ops, one per output.
  unique_outputs unique(output x) { return {build("unique", {x}), build("unique_idx", {x})}; }
  /// tf.math.unsorted_segment_sum: rows of `data` summed into `num_segments`
  /// (an int scalar) rows by `segment_ids`, whose shape is a prefix of data's.
  output unsorted_segment_sum(output data, output segment_ids, output num_segments) {
    return build("unsorted_segment_sum", {data, segment_ids, num_segments});
  }

private:
  output build(const std::string& kind, std::vector<output> inputs, op_attrs attrs = {},
            const std::string& name = "") {
    return static_cast<Builder&>(*this).op(kind, std::move(inputs), attrs, name);
  }
};

} // namespace af
