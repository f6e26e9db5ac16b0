// Reverse-mode differentiation of a graph (tf.gradients): one rule per
// kernel op, each adding its backward ops to the graph.
#include <map>

#include "graph/graph.hpp"

namespace af {

namespace {

/// The kernel ops that have a rule in gradients(), with their input counts.
const std::map<std::string, size_t>& differentiable_ops() {
  static const std::map<std::string, size_t> ops = {
    {"add", 2},     {"sub", 2},     {"mul", 2},    {"div", 2},          {"neg", 1},
    {"exp", 1},     {"log", 1},     {"relu", 1},   {"sigmoid", 1},      {"tanh", 1},
    {"square", 1},  {"sqrt", 1},    {"matmul", 2}, {"sum", 1},          {"mean", 1},
    {"max", 1},     {"softmax", 1}, {"log_softmax", 1}, {"softmax_xent", 2},
  };
  return ops;
}

} // namespace

bool has_gradient(const std::string& op) {
  return differentiable_ops().count(op) > 0;
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
  auto accumulate = [&](int32_t id, output d) {
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
    auto rule = differentiable_ops().find(fwd.op);
    if (rule == differentiable_ops().end())
      return graph_error{af_error::unsupported,
                         "gradients(): op '" + fwd.name + "' (" + fwd.op + ") has no gradient"};
    if (fwd.inputs.size() != rule->second)
      return graph_error{af_error::invalid_argument,
                         "gradients(): op '" + fwd.name + "' (" + fwd.op + ") has "
                           + std::to_string(fwd.inputs.size()) + " input(s), needs "
                           + std::to_string(rule->second)};
    at(fwd);
    auto in = [&](size_t i) { return output{fwd.inputs.at(i)}; };
    auto arg = [&](size_t i) { return fwd.inputs.at(i); };
    output y{id};
    const auto& k = fwd.op;
    if (k == "add" || k == "sub") {
      accumulate(arg(0), g.op("sum_to", {dy, in(0)}));
      accumulate(arg(1), g.op("sum_to", {k == "add" ? dy : g.neg(dy), in(1)}));
    } else if (k == "mul") {
      accumulate(arg(0), g.op("sum_to", {g.mul(dy, in(1)), in(0)}));
      accumulate(arg(1), g.op("sum_to", {g.mul(dy, in(0)), in(1)}));
    } else if (k == "div") {
      accumulate(arg(0), g.op("sum_to", {g.div(dy, in(1)), in(0)}));
      accumulate(arg(1), g.op("sum_to", {g.neg(g.div(g.mul(dy, y), in(1))), in(1)}));
    } else if (k == "neg") {
      accumulate(arg(0), g.neg(dy));
    } else if (k == "exp") {
      accumulate(arg(0), g.mul(dy, y));
    } else if (k == "log") {
      accumulate(arg(0), g.div(dy, in(0)));
    } else if (k == "relu") {
      accumulate(arg(0), g.op("relu_grad", {dy, in(0)}));
    } else if (k == "sigmoid" || k == "tanh") {
      accumulate(arg(0), g.op(k + "_grad", {dy, y}));
    } else if (k == "square") {
      accumulate(arg(0), g.mul(dy, g.add(in(0), in(0))));
    } else if (k == "sqrt") {
      accumulate(arg(0), g.div(dy, g.add(y, y)));
    } else if (k == "matmul") {
      bool ta = fwd.attrs.transpose_a, tb = fwd.attrs.transpose_b;
      auto a = in(0), b = in(1);
      if (!ta && !tb) { // y = a b
        accumulate(a.id, g.matmul(dy, b, false, true));
        accumulate(b.id, g.matmul(a, dy, true, false));
      } else if (!ta && tb) { // y = a b^T
        accumulate(a.id, g.matmul(dy, b, false, false));
        accumulate(b.id, g.matmul(dy, a, true, false));
      } else if (ta && !tb) { // y = a^T b
        accumulate(a.id, g.matmul(b, dy, false, true));
        accumulate(b.id, g.matmul(a, dy, false, false));
      } else { // y = a^T b^T
        accumulate(a.id, g.matmul(b, dy, true, true));
        accumulate(b.id, g.matmul(dy, a, true, true));
      }
    } else if (k == "sum" || k == "mean") {
      accumulate(arg(0), g.op(k + "_grad", {dy, in(0)}, fwd.attrs));
    } else if (k == "max") {
      accumulate(arg(0), g.op("max_grad", {dy, in(0), y}, fwd.attrs));
    } else if (k == "softmax" || k == "log_softmax") {
      accumulate(arg(0), g.op(k + "_grad", {dy, y}));
    } else if (k == "softmax_xent") {
      accumulate(arg(0), g.op("softmax_xent_grad", {dy, in(0), in(1)}));
    } else {
      return graph_error{af_error::internal, "gradients(): op '" + fwd.name + "' (" + k
                                               + ") is listed as differentiable but has no rule"};
    }
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
