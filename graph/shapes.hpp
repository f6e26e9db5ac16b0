#pragma once
/// Static shapes: what a graph knows of a node's value before it runs (TF
/// 1.x's Tensor.shape at build time). A placeholder may say little
/// (`[?, 3]`, or no shape at all); variables and constants say everything;
/// an op's follows from its inputs' through the registry's shape rules
/// (kernels/op_registry.hpp) where every input is known, and through the
/// partial rules here (broadcasting, matmul, reductions, gather, concat,
/// softmax_xent, the elementwise functions) where some dimension is not.
/// An op whose known dimensions cannot fit is refused with TF's sentence,
/// naming the op and its input shapes, when the graph is built rather than
/// when it runs.
///
///   af::graph g;
///   auto x = g.placeholder("x", dtype::float32, shape_type{unknown, 3});
///   af::static_shapes shapes;
///   auto r = infer_static("matmul", {}, {shapes.of(g, x), {dtype::float32, shape_type{4, 5}}},
///                         "matmul"); // error: Dimensions must be equal, but are 3 and 4 ...

#include <optional>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace af {

/// A dimension of any size (TF's None / `?`): kernels::unknown_dim.
constexpr int64_t any_dim = -1;

/// A value's dtype and shape as far as the graph knows them.
struct static_info {
  std::optional<dtype> type;       ///< nullopt: not known
  std::optional<shape_type> shape; ///< nullopt: not even the rank; else any_dim where unknown

  /// Every dimension known.
  bool fully_defined() const;
};

/// TF's text of a static shape: "[?,3]", "[]" for a scalar, "?" for an
/// unknown rank.
std::string static_shape_string(const std::optional<shape_type>& shape);

/// The output of op `kind` (a registry op's graph name) on inputs like `in`,
/// or a shape_mismatch error naming `name` and `kind` with TF's sentence
/// ("Dimensions must be equal, but are 3 and 4 for 'matmul' (op: 'matmul')
/// with input shapes: [?,3], [4,5]."). What cannot be inferred (an op
/// without a partial rule, a dtype the rule refuses) is unknown, never an
/// error: running says more.
outcome<static_info> infer_static(const std::string& kind, const op_attrs& attrs,
                                  const std::vector<static_info>& in, const std::string& name);

/// The static info of each node of a graph, computed once per node as the
/// graph grows (ids are a topological order, and nodes never change their
/// inputs). Not thread-safe: one per graph, used where the graph is built.
class static_shapes {
public:
  /// `o`'s info; nothing for an id the graph lacks.
  const static_info& of(const graph& g, output o);

private:
  std::vector<static_info> known_;
};

} // namespace af
