// Reverse-mode differentiation of a graph (tf.gradients): one rule per
// differentiable op of the registry (kernels/op_registry.hpp), keyed by its
// name, each adding its backward ops to the graph.
#include <functional>
#include <map>

#include "graph/graph.hpp"
#include "kernels/op_registry.hpp"

namespace af {

namespace {

/// What a gradient rule sees: the forward op, its output y, the gradient dy
/// flowing into y, and `add`, which adds to the gradient of input i (dense),
/// or `add_sparse`, which adds rows of it (gather's rule).
struct grad_context {
  graph& g;
  const graph_node& fwd;
  output y;
  output dy;
  const std::function<void(int32_t, gradient_value)>& accumulate;

  output in(size_t i) const { return output{fwd.inputs.at(i)}; }
  void add(size_t i, output d) const {
    accumulate(fwd.inputs.at(i), gradient_value::dense_value(d));
  }
  /// Rows `values` ([n] + row) of the gradient of input i at `ids` ([n]).
  void add_sparse(size_t i, output ids, output values) const {
    accumulate(fwd.inputs.at(i), gradient_value::sparse_value(ids, values, in(i)));
  }
};

/// One op's gradient (TF's REGISTER_GRADIENT): adds the backward ops of one
/// forward op, in its scope.
using gradient_rule = void (*)(const grad_context&);

void add_grad(const grad_context& c) {
  c.add(0, c.g.op("sum_to", {c.dy, c.in(0)}));
  c.add(1, c.g.op("sum_to", {c.dy, c.in(1)}));
}

void sub_grad(const grad_context& c) {
  c.add(0, c.g.op("sum_to", {c.dy, c.in(0)}));
  c.add(1, c.g.op("sum_to", {c.g.neg(c.dy), c.in(1)}));
}

void mul_grad(const grad_context& c) {
  auto& g = c.g;
  c.add(0, g.op("sum_to", {g.mul(c.dy, c.in(1)), c.in(0)}));
  c.add(1, g.op("sum_to", {g.mul(c.dy, c.in(0)), c.in(1)}));
}

void div_grad(const grad_context& c) {
  auto& g = c.g;
  c.add(0, g.op("sum_to", {g.div(c.dy, c.in(1)), c.in(0)}));
  c.add(1, g.op("sum_to", {g.neg(g.div(g.mul(c.dy, c.y), c.in(1))), c.in(1)}));
}

void neg_grad(const grad_context& c) {
  c.add(0, c.g.neg(c.dy));
}

void exp_grad(const grad_context& c) {
  c.add(0, c.g.mul(c.dy, c.y));
}

void log_grad(const grad_context& c) {
  c.add(0, c.g.div(c.dy, c.in(0)));
}

void relu_grad(const grad_context& c) {
  c.add(0, c.g.op("relu_grad", {c.dy, c.in(0)}));
}

/// sigmoid, tanh, softmax, log_softmax: OP_grad(dy, y), from the forward output.
void from_output_grad(const grad_context& c) {
  c.add(0, c.g.op(c.fwd.op + "_grad", {c.dy, c.y}));
}

void square_grad(const grad_context& c) {
  c.add(0, c.g.mul(c.dy, c.g.add(c.in(0), c.in(0))));
}

void sqrt_grad(const grad_context& c) {
  c.add(0, c.g.div(c.dy, c.g.add(c.y, c.y)));
}

void softplus_grad(const grad_context& c) {
  c.add(0, c.g.mul(c.dy, c.g.sigmoid(c.in(0))));
}

void matmul_grad(const grad_context& c) {
  auto& g = c.g;
  auto dy = c.dy;
  bool ta = c.fwd.attrs.transpose_a, tb = c.fwd.attrs.transpose_b;
  auto a = c.in(0), b = c.in(1);
  if (!ta && !tb) { // y = a b
    c.add(0, g.matmul(dy, b, false, true));
    c.add(1, g.matmul(a, dy, true, false));
  } else if (!ta && tb) { // y = a b^T
    c.add(0, g.matmul(dy, b, false, false));
    c.add(1, g.matmul(dy, a, true, false));
  } else if (ta && !tb) { // y = a^T b
    c.add(0, g.matmul(b, dy, false, true));
    c.add(1, g.matmul(a, dy, false, false));
  } else { // y = a^T b^T
    c.add(0, g.matmul(b, dy, true, true));
    c.add(1, g.matmul(dy, a, true, true));
  }
}

/// sum, mean: OP_grad(dy, x) with the forward attributes.
void sum_mean_grad(const grad_context& c) {
  c.add(0, c.g.op(c.fwd.op + "_grad", {c.dy, c.in(0)}, c.fwd.attrs));
}

void max_grad(const grad_context& c) {
  c.add(0, c.g.op("max_grad", {c.dy, c.in(0), c.y}, c.fwd.attrs));
}

void softmax_xent_grad(const grad_context& c) {
  c.add(0, c.g.op("softmax_xent_grad", {c.dy, c.in(0), c.in(1)}));
}

/// w.r.t. params only: the ids are integers (TF's gradient for them is None).
/// Sparse, TF's _GatherGrad: IndexedSlices of dy's rows at the ids, both
/// flattened to one row per id (flatten_rows: no copy), never params' size;
/// densify() makes it gather_grad when a dense gradient is asked for.
void gather_grad(const grad_context& c) {
  auto ids = c.in(1);
  c.add_sparse(0, c.g.op("flatten_rows", {ids, ids}), c.g.op("flatten_rows", {c.dy, ids}));
}

/// The gradient rules, keyed by the op's registry name: every op that the
/// registry marks op_gradient::rule has one, and nothing else (a test walks
/// both).
const std::map<std::string, gradient_rule>& gradient_rules() {
  static const std::map<std::string, gradient_rule> rules = {
    {"add", add_grad},
    {"sub", sub_grad},
    {"mul", mul_grad},
    {"div", div_grad},
    {"neg", neg_grad},
    {"exp", exp_grad},
    {"log", log_grad},
    {"relu", relu_grad},
    {"sigmoid", from_output_grad},
    {"tanh", from_output_grad},
    {"square", square_grad},
    {"sqrt", sqrt_grad},
    {"softplus", softplus_grad},
    {"matmul", matmul_grad},
    {"sum", sum_mean_grad},
    {"mean", sum_mean_grad},
    {"max", max_grad},
    {"softmax", from_output_grad},
    {"log_softmax", from_output_grad},
    {"softmax_xent", softmax_xent_grad},
    {"gather", gather_grad},
    // -- issue 25, partitioned tables (h/part): dynamic_stitch, TF's
    // _DynamicStitchGrads. Inputs are N indices then N data; data m gets
    // gather(dy, indices m), the indices none (integers). As in TF, a slice
    // that a later index overwrote still gets the gradient of the merged row.
    {"dynamic_stitch",
     [](const grad_context& c) {
       const size_t n = c.fwd.inputs.size() / 2;
       for (size_t m = 0; m < n; ++m)
         c.add(n + m, c.g.gather(c.dy, c.in(m), "dynamic_stitch_grad"));
     }},
    // -- end of h/part's block
  };
  return rules;
}

} // namespace

bool has_gradient(const std::string& op) {
  return gradient_rules().count(op) > 0;
}

std::vector<std::string> gradient_ops() {
  std::vector<std::string> out;
  for (const auto& [name, rule] : gradient_rules())
    out.push_back(name);
  return out;
}

namespace {

/// A gradient being summed: its value and, if sparse, the scopes it was made
/// in, where its densification goes (gather's device, as a dense gather_grad
/// went before gradients were sparse).
struct partial {
  gradient_value v;
  std::vector<device_name> scopes;
};

/// The dense value of `p`, its densification made in p's scopes.
output dense_of(graph& g, const partial& p) {
  if (!p.v.is_sparse())
    return p.v.dense;
  auto saved = g.scopes();
  g.set_scopes(p.scopes);
  auto out = densify(g, p.v);
  g.set_scopes(std::move(saved));
  return out;
}

/// The backward pass: every x's gradient, sparse where gather made it so.
outcome<std::vector<partial>> backprop(graph& g, output loss, const std::vector<output>& xs) {
  if (!g.contains(loss))
    return graph_error{af_error::invalid_argument,
                       "gradients(): the loss is not an op of this graph"};
  // Backward ops go on the device their forward op asked for; the caller's
  // scopes come back afterwards, on every path out.
  struct scope_guard {
    graph& g;
    std::vector<device_name> saved;
    ~scope_guard() { g.set_scopes(std::move(saved)); }
  } restore{g, g.scopes()};
  auto at = [&](const graph_node& fwd) { g.set_scopes({fwd.requested}); };
  std::map<int32_t, partial> grads;
  // Sums as TF's aggregation does: dense + dense adds, sparse + sparse
  // concatenates ids and rows (IndexedSlices), sparse + dense densifies.
  std::function<void(int32_t, gradient_value)> accumulate = [&](int32_t id, gradient_value d) {
    auto it = grads.find(id);
    if (it == grads.end()) {
      grads.emplace(id, partial{d, g.scopes()});
      return;
    }
    auto& have = it->second;
    if (have.v.is_sparse() && d.is_sparse()) {
      have.v.ids = g.op("concat", {have.v.ids, d.ids}, {}, "grad_acc_ids");
      have.v.values = g.op("concat", {have.v.values, d.values}, {}, "grad_acc_values");
      have.scopes = g.scopes();
      return;
    }
    auto sum = g.add(dense_of(g, have), dense_of(g, partial{d, g.scopes()}), "grad_acc");
    have = partial{gradient_value::dense_value(sum), g.scopes()};
  };
  at(g.at(loss));
  auto seed = g.op("ones_like", {loss}, {}, "grad_seed");
  grads.emplace(loss.id, partial{gradient_value::dense_value(seed), {}});
  // Nodes are appended after their inputs, so descending ids visit every
  // consumer of a node before the node itself.
  for (int32_t id = loss.id; id >= 0; --id) {
    auto it = grads.find(id);
    if (it == grads.end())
      continue;
    const graph_node fwd = g.at(output{id}); // a copy: the graph grows below
    if (fwd.kind != node_kind::compute)
      continue; // variables, constants and placeholders are leaves; updates stop gradients
    auto rule = gradient_rules().find(fwd.op);
    if (rule == gradient_rules().end())
      return graph_error{af_error::unsupported,
                         "gradients(): op '" + fwd.name + "' (" + fwd.op + ") has no gradient"};
    const auto* def = kernels::find_op_def(fwd.op);
    if (def != nullptr && !def->takes(fwd.inputs.size())) // variadic: dynamic_stitch
      return graph_error{af_error::invalid_argument,
                         "gradients(): op '" + fwd.name + "' (" + fwd.op + ") has "
                           + std::to_string(fwd.inputs.size()) + " input(s), needs "
                           + std::to_string(def->arity())};
    auto dy = dense_of(g, it->second); // an op's rule takes a dense dy (gather(relu(w), ids))
    at(fwd);
    rule->second(grad_context{g, fwd, output{id}, dy, accumulate});
  }
  std::vector<partial> out;
  std::string missing;
  for (auto x : xs) {
    auto it = grads.find(x.id);
    if (it == grads.end() || x.id > loss.id)
      missing += (missing.empty() ? "" : ", ")
                 + (g.contains(x) ? "'" + g.at(x).name + "'" : "output " + std::to_string(x.id));
    else
      out.push_back(it->second);
  }
  if (!missing.empty())
    return graph_error{af_error::invalid_argument,
                       "gradients(): the loss does not depend on " + missing};
  return out;
}

} // namespace

outcome<std::vector<output>> gradients(graph& g, output loss, const std::vector<output>& xs) {
  auto parts = backprop(g, loss, xs);
  if (!parts)
    return parts.error();
  std::vector<output> out;
  for (const auto& p : *parts)
    out.push_back(dense_of(g, p));
  return out;
}

outcome<std::vector<gradient_value>> sparse_gradients(graph& g, output loss,
                                                      const std::vector<output>& xs) {
  auto parts = backprop(g, loss, xs);
  if (!parts)
    return parts.error();
  std::vector<gradient_value> out;
  for (const auto& p : *parts)
    out.push_back(p.v);
  return out;
}

output densify(graph& g, const gradient_value& v) {
  if (!v.is_sparse())
    return v.dense;
  return g.op("gather_grad", {v.values, v.dense_like, v.ids});
}

gradient_value deduplicate(graph& g, const gradient_value& v) {
  if (!v.is_sparse())
    return v;
  auto u = g.unique(v.ids);
  auto rows = g.unsorted_segment_sum(v.values, u.idx, g.op("size", {u.y}));
  return gradient_value::sparse_value(u.y, rows, v.dense_like);
}

} // namespace af
