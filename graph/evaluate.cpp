#include "graph/evaluate.hpp"
#include "kernels/sparse.hpp"
#include "kernels/table_init.hpp"

#include <limits>
#include <new>
#include <optional>

namespace af {

namespace {

std::string quoted(const std::string& name) {
  return "'" + name + "'";
}

/// The bytes a value of `shape` and `type` takes; nullopt if a dimension is
/// negative or the count does not fit an int64 / size_t.
std::optional<uint64_t> byte_count(const shape_type& shape, dtype type) {
  const auto limit = std::min<uint64_t>(static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                                        static_cast<uint64_t>(std::numeric_limits<size_t>::max()));
  uint64_t count = 1;
  for (auto d : shape)
    if (d < 0)
      return std::nullopt;
  for (auto d : shape)
    if (d == 0)
      return 0;
  for (auto d : shape) {
    auto dim = static_cast<uint64_t>(d);
    if (count > limit / dim)
      return std::nullopt;
    count *= dim;
  }
  auto elem = static_cast<uint64_t>(dtype_size(type));
  if (count > limit / elem)
    return std::nullopt;
  return count * elem;
}

af_error code_of(kernels::status::kind k) {
  switch (k) {
    case kernels::status::kind::shape: return af_error::shape_mismatch;
    case kernels::status::kind::dtype: return af_error::dtype_mismatch;
    case kernels::status::kind::unsupported: return af_error::unsupported;
    default: return af_error::invalid_argument;
  }
}

} // namespace

outcome<tensor> initial_value(const variable_spec& spec, const initializer& init) {
  const auto what = "initializer of " + quoted(spec.name);
  auto bytes = byte_count(spec.shape, spec.type);
  if (!bytes)
    return graph_error{af_error::invalid_argument,
                       what + ": shape " + shape_string(spec.shape)
                         + (num_elements(spec.shape) < 0 ? " has a negative dimension"
                                                         : " has too many elements")};
  try {
    if (init.kind == "tensor") {
      if (init.from.empty())
        return graph_error{af_error::invalid_argument, what + ": kind tensor without a tensor"};
      if (init.from.type() != spec.type)
        return graph_error{af_error::dtype_mismatch,
                           what + ": tensor has dtype " + dtype_name(init.from.type())
                             + ", variable has " + dtype_name(spec.type)};
      if (init.from.shape() != spec.shape)
        return graph_error{af_error::shape_mismatch,
                           what + ": tensor has shape " + shape_string(init.from.shape())
                             + ", variable has " + shape_string(spec.shape)};
      return init.from;
    }
    if (init.kind == "constant")
      return tensor::filled(spec.type, spec.shape, init.value);
    if (init.kind == "zeros")
      return tensor::filled(spec.type, spec.shape, 0);
    if (init.kind == "ones")
      return tensor::filled(spec.type, spec.shape, 1);
    if (init.kind == "uniform" || init.kind == "normal") {
      tensor fresh{spec.type, spec.shape};
      auto dist = init.kind == "uniform" ? kernels::table_distribution::uniform
                                         : kernels::table_distribution::normal;
      auto st = init.table ? kernels::fill_table(fresh, dist, init.a, init.b, init.seed,
                                                 {init.row_start, init.row_stride})
                : init.kind == "uniform" ? kernels::fill_uniform(fresh, init.a, init.b, init.seed)
                                         : kernels::fill_normal(fresh, init.a, init.b, init.seed);
      if (!st.ok())
        return graph_error{af_error::invalid_argument, what + ": " + st.error};
      return fresh;
    }
  } catch (const std::bad_alloc&) {
    return graph_error{af_error::resource_exhausted,
                       what + ": cannot allocate " + std::to_string(*bytes) + " bytes for "
                         + dtype_name(spec.type) + shape_string(spec.shape)};
  }
  return graph_error{af_error::invalid_argument,
                     what + ": unknown kind '" + init.kind
                       + "' (use constant, zeros, ones, uniform, normal or tensor)"};
}

graph_status initialize_values(const graph& g, variable_values& vars) {
  for (auto v : g.variables()) {
    const auto& n = g.at(v);
    if (vars.count(n.spec.name))
      continue;
    auto value = initial_value(n.spec, n.init);
    if (!value)
      return value.error();
    vars.emplace(n.spec.name, std::move(*value));
  }
  return ok();
}

namespace {

/// One step of a graph in this process: nodes in ascending id order.
class evaluator {
public:
  evaluator(const graph& g, variable_values& vars, kernels::backend& backend)
    : g_(g), vars_(vars), backend_(backend) {
    // nop
  }

  graph_status feed(output o, const tensor& value) {
    if (!g_.contains(o) || g_.at(o).kind != node_kind::placeholder)
      return graph_error{af_error::invalid_argument, "a feed is not a placeholder of this graph"};
    fed_[o.id] = value;
    return ok();
  }

  /// The value of a variable, constant or placeholder now.
  outcome<tensor> leaf(int32_t id) const {
    const auto& n = g_.at(output{id});
    switch (n.kind) {
      case node_kind::variable: {
        auto it = vars_.find(n.spec.name);
        if (it == vars_.end() || it->second.empty())
          return graph_error{af_error::uninitialized,
                             "variable " + quoted(n.spec.name)
                               + " is read before it was initialized; initialize it first "
                                 "(initialize_values())"};
        return it->second;
      }
      case node_kind::constant:
        return n.value;
      case node_kind::placeholder: {
        auto it = fed_.find(id);
        if (it == fed_.end())
          return graph_error{af_error::invalid_argument,
                             "placeholder " + quoted(n.name)
                               + " needs a value: pass it in run()'s feeds"};
        return it->second;
      }
      default:
        return graph_error{af_error::internal, "node " + quoted(n.name) + " is not a leaf"};
    }
  }

  outcome<tensor> input(int32_t id) const {
    const auto& n = g_.at(output{id});
    if (n.kind == node_kind::compute || n.kind == node_kind::update)
      return computed_.at(id);
    return leaf(id);
  }

  graph_status run(int32_t id) {
    const auto& n = g_.at(output{id});
    if (n.kind == node_kind::update)
      return update(id, n);
    std::vector<tensor> in;
    for (auto x : n.inputs) {
      auto v = input(x);
      if (!v)
        return v.error();
      in.push_back(std::move(*v));
    }
    tensor out;
    auto st = kernels::run_op(backend_, n.op, n.attrs, in, out);
    if (!st.ok())
      return graph_error{code_of(st.what), "op " + quoted(n.name) + " (" + n.op + "): " + st.error};
    computed_[id] = std::move(out);
    return ok();
  }

  const std::map<int32_t, tensor>& computed() const { return computed_; }

private:
  /// scatter_add / _sub / _update (var, indices, updates), as the variable
  /// actor does them: every id checked first, the value unchanged on an error.
  graph_status scatter(int32_t id, const graph_node& n, kernels::scatter_op op) {
    const auto* var = n.inputs.size() == 3 ? g_.variable_node(output{n.inputs[0]}) : nullptr;
    if (var == nullptr)
      return graph_error{af_error::invalid_argument,
                         "op " + quoted(n.name) + " (" + n.op + ") does not update a variable"};
    const auto what = n.op + " to variable " + quoted(var->spec.name);
    auto indices = input(n.inputs[1]);
    if (!indices)
      return indices.error();
    auto updates = input(n.inputs[2]);
    if (!updates)
      return updates.error();
    auto it = vars_.find(var->spec.name);
    if (it == vars_.end() || it->second.empty())
      return graph_error{af_error::uninitialized,
                         what + " before it was initialized; initialize it first"};
    // Moved out, the value is written in place unless a fetched result holds
    // its buffer; a refused scatter wrote nothing and it goes back as it was.
    tensor value = std::move(it->second);
    auto st = kernels::host_scatter(op, value, *indices, *updates);
    it->second = value;
    if (!st.ok())
      return graph_error{code_of(st.what), what + ": " + st.error};
    computed_[id] = std::move(value);
    return ok();
  }

  /// assign / assign_add / assign_sub, with a variable actor's operand rules.
  graph_status update(int32_t id, const graph_node& n) {
    if (auto op = kernels::parse_scatter_op(n.op))
      return scatter(id, n, *op);
    const auto* var = n.inputs.size() == 2 ? g_.variable_node(output{n.inputs[0]}) : nullptr;
    if (var == nullptr)
      return graph_error{af_error::invalid_argument,
                         "op " + quoted(n.name) + " (" + n.op + ") does not update a variable"};
    const auto& spec = var->spec;
    const auto what = n.op + " to " + quoted(spec.name);
    auto operand = input(n.inputs[1]);
    if (!operand)
      return operand.error();
    if (operand->empty())
      return graph_error{af_error::invalid_argument, what + ": no value given"};
    if (operand->type() != spec.type)
      return graph_error{af_error::dtype_mismatch,
                         what + ": value has dtype " + dtype_name(operand->type())
                           + ", variable has " + dtype_name(spec.type)};
    bool accumulate = n.op != "assign";
    bool scalar = operand->num_elements() == 1 && operand->shape().size() <= spec.shape.size();
    if (operand->shape() != spec.shape && !(scalar && accumulate))
      return graph_error{af_error::shape_mismatch,
                         what + ": value has shape " + shape_string(operand->shape())
                           + ", variable has " + shape_string(spec.shape)};
    if (!accumulate) {
      vars_[spec.name] = *operand;
      computed_[id] = std::move(*operand);
      return ok();
    }
    auto it = vars_.find(spec.name);
    if (it == vars_.end() || it->second.empty())
      return graph_error{af_error::uninitialized,
                         what + " before it was initialized; initialize it first"};
    auto op = n.op == "assign_add" ? kernels::binary_op::add : kernels::binary_op::sub;
    // Moved out of `vars`, the value is private unless a fetched result still
    // holds its buffer; binary_inplace then writes a fresh buffer instead.
    tensor value = std::move(it->second);
    auto st = backend_.binary_inplace(op, value, *operand);
    if (!st.ok()) {
      it->second = std::move(value);
      return graph_error{code_of(st.what), what + ": " + st.error};
    }
    it->second = value;
    computed_[id] = std::move(value);
    return ok();
  }

  const graph& g_;
  variable_values& vars_;
  kernels::backend& backend_;
  std::map<int32_t, tensor> fed_;
  std::map<int32_t, tensor> computed_;
};

} // namespace

outcome<std::vector<tensor>> evaluate(const graph& g, const std::vector<output>& fetches,
                                      const std::vector<std::pair<output, tensor>>& feeds,
                                      variable_values& vars, kernels::backend& backend) {
  evaluator step{g, vars, backend};
  for (const auto& [o, v] : feeds)
    if (auto st = step.feed(o, v); !st)
      return st.error();
  std::vector<int32_t> roots;
  for (auto o : fetches)
    roots.push_back(o.id);
  auto closure = g.closure(roots);
  if (!closure)
    return closure.error();
  // Fetched variables are read before the step's updates, as a session reads them.
  std::map<int32_t, tensor> leaves;
  for (auto o : fetches) {
    auto kind = g.at(o).kind;
    if (kind == node_kind::compute || kind == node_kind::update || leaves.count(o.id))
      continue;
    auto v = step.leaf(o.id);
    if (!v)
      return v.error();
    leaves.emplace(o.id, std::move(*v));
  }
  for (auto id : *closure) // ascending ids: a topological order
    if (auto st = step.run(id); !st)
      return st.error();
  std::vector<tensor> out;
  out.reserve(fetches.size());
  for (auto o : fetches) {
    auto it = leaves.find(o.id);
    out.push_back(it != leaves.end() ? it->second : step.computed().at(o.id));
  }
  return out;
}

} // namespace af
