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
/// flowing into y, and `add`, which adds to the gradient of input i.
struct grad_context {
  graph& g;
  const graph_node& fwd;
  output y;
  output dy;
  const std::function<void(int32_t, output)>& accumulate;

  output in(size_t i) const { return output{fwd.inputs.at(i)}; }
  void add(size_t i, output d) const { accumulate(fwd.inputs.at(i), d); }
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
/// Dense for now: dy's rows summed into a tensor of params' shape, rows with
/// no id getting zeros (TF gives IndexedSlices; that value is the next step).
void gather_grad(const grad_context& c) {
  c.add(0, c.g.op("gather_grad", {c.dy, c.in(0), c.in(1)}));
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

outcome<std::vector<output>> gradients(graph& g, output loss, const std::vector<output>& xs) {
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
  std::map<int32_t, output> grads;
  std::function<void(int32_t, output)> accumulate = [&](int32_t id, output d) {
    auto it = grads.find(id);
    if (it == grads.end())
      grads.emplace(id, d);
    else
      it->second = g.add(it->second, d, "grad_acc");
  };
  at(g.at(loss));
  grads.emplace(loss.id, g.op("ones_like", {loss}, {}, "grad_seed"));
  // Nodes are appended after their inputs, so descending ids visit every
  // consumer of a node before the node itself.
  for (int32_t id = loss.id; id >= 0; --id) {
    auto it = grads.find(id);
    if (it == grads.end())
      continue;
    auto dy = it->second;
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
    at(fwd);
    rule->second(grad_context{g, fwd, output{id}, dy, accumulate});
  }
  std::vector<output> out;
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

} // namespace af
