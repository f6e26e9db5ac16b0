#include "graph/graph.hpp"

#include <limits>
#include <sstream>

namespace af {

namespace {

std::string quoted(const std::string& name) {
  return "'" + name + "'";
}

/// Why `shape` of `type` cannot be a variable's value, or empty if it can:
/// a negative dimension, or more elements or bytes than an int64 / size_t holds.
std::string invalid_shape(const shape_type& shape, dtype type) {
  for (auto d : shape)
    if (d < 0)
      return "shape " + shape_string(shape) + " has a negative dimension";
  const auto max_bytes = static_cast<uint64_t>(
    std::min<uint64_t>(static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                       static_cast<uint64_t>(std::numeric_limits<size_t>::max())));
  const auto elem = static_cast<uint64_t>(dtype_size(type));
  uint64_t count = 1;
  bool zero = false;
  for (auto d : shape)
    zero = zero || d == 0;
  if (zero)
    return {};
  for (auto d : shape) {
    auto dim = static_cast<uint64_t>(d);
    if (count > max_bytes / dim)
      return "shape " + shape_string(shape) + " has too many elements";
    count *= dim;
  }
  if (count > max_bytes / elem)
    return "shape " + shape_string(shape) + " has too many elements";
  return {};
}

} // namespace

void graph::push_scope(device_name d) {
  scopes_[std::this_thread::get_id()].push_back(std::move(d));
}

void graph::pop_scope() {
  auto it = scopes_.find(std::this_thread::get_id());
  if (it == scopes_.end())
    return;
  if (!it->second.empty())
    it->second.pop_back();
  if (it->second.empty()) // a thread id may be reused by a later thread
    scopes_.erase(it);
}

const std::vector<device_name>& graph::scopes() const {
  static const std::vector<device_name> none;
  auto it = scopes_.find(std::this_thread::get_id());
  return it == scopes_.end() ? none : it->second;
}

void graph::set_scopes(std::vector<device_name> s) {
  if (s.empty())
    scopes_.erase(std::this_thread::get_id());
  else
    scopes_[std::this_thread::get_id()] = std::move(s);
}

device_name graph::current_scope() const {
  device_name d;
  for (const auto& s : scopes()) // inner scopes win over outer ones
    d = s.merged_into(d);
  return d;
}

std::string graph::unique_name(const std::string& base) {
  for (;;) {
    auto n = name_counts_[base]++;
    auto candidate = n == 0 ? base : base + "_" + std::to_string(n);
    if (used_names_.insert(candidate).second)
      return candidate;
  }
}

outcome<output> graph::variable(const std::string& name, shape_type shape, initializer init,
                                dtype type) {
  if (name.empty())
    return graph_error{af_error::invalid_argument, "a variable needs a non-empty name"};
  if (auto why = invalid_shape(shape, type); !why.empty())
    return graph_error{af_error::invalid_argument, "variable " + quoted(name) + ": " + why};
  if (auto existing = find_variable(name); existing.valid()) {
    const auto& have = at(existing).spec;
    if (have.type != type)
      return graph_error{af_error::dtype_mismatch,
                         "variable " + quoted(name) + " exists in this graph with dtype "
                           + dtype_name(have.type) + ", requested " + dtype_name(type)};
    if (have.shape != shape)
      return graph_error{af_error::shape_mismatch,
                         "variable " + quoted(name) + " exists in this graph with shape "
                           + shape_string(have.shape) + ", requested " + shape_string(shape)
                           + "; use another name or the same shape"};
    return existing;
  }
  graph_node n;
  n.kind = node_kind::variable;
  n.name = name; // a variable's name is its identity in the cluster: never uniquified
  used_names_.insert(name);
  n.requested = current_scope();
  n.spec = variable_spec{name, type, std::move(shape), std::string{}};
  n.init = std::move(init);
  nodes_.push_back(std::move(n));
  return output{static_cast<int32_t>(nodes_.size() - 1)};
}

output graph::constant(tensor value, const std::string& name) {
  graph_node n;
  n.kind = node_kind::constant;
  n.name = unique_name(name);
  n.requested = current_scope();
  n.value = std::move(value);
  nodes_.push_back(std::move(n));
  return output{static_cast<int32_t>(nodes_.size() - 1)};
}

output graph::placeholder(const std::string& name) {
  graph_node n;
  n.kind = node_kind::placeholder;
  n.name = unique_name(name);
  n.requested = current_scope();
  nodes_.push_back(std::move(n));
  return output{static_cast<int32_t>(nodes_.size() - 1)};
}

output graph::placeholder(const std::string& name, dtype type, std::optional<shape_type> shape) {
  auto o = placeholder(name);
  auto& n = nodes_.back();
  n.feed_type = type;
  n.feed_shape = std::move(shape);
  return o;
}

output graph::op(const std::string& kind, std::vector<output> inputs, op_attrs attrs,
                 const std::string& name) {
  graph_node n;
  n.kind = node_kind::compute;
  n.op = kind;
  n.attrs = attrs;
  n.name = unique_name(name.empty() ? kind : name);
  n.requested = current_scope();
  for (auto in : inputs)
    n.inputs.push_back(in.id);
  nodes_.push_back(std::move(n));
  return output{static_cast<int32_t>(nodes_.size() - 1)};
}

output graph::update(const char* kind, output var, std::vector<output> operands,
                     const std::string& name) {
  const auto* v = variable_node(var);
  if (v == nullptr)
    return output{};
  graph_node n;
  n.kind = node_kind::update;
  n.op = kind;
  n.name = unique_name(name.empty() ? v->name + "/" + kind : name);
  n.requested = v->requested; // runs where its variable lives
  n.inputs = {var.id};
  for (auto o : operands)
    n.inputs.push_back(o.id);
  nodes_.push_back(std::move(n));
  return output{static_cast<int32_t>(nodes_.size() - 1)};
}

output graph::assign(output var, output value, const std::string& name) {
  return update("assign", var, {value}, name);
}

output graph::assign_add(output var, output value, const std::string& name) {
  return update("assign_add", var, {value}, name);
}

output graph::assign_sub(output var, output value, const std::string& name) {
  return update("assign_sub", var, {value}, name);
}

output graph::scatter_add(output var, output indices, output updates, const std::string& name) {
  return update("scatter_add", var, {indices, updates}, name);
}

output graph::scatter_sub(output var, output indices, output updates, const std::string& name) {
  return update("scatter_sub", var, {indices, updates}, name);
}

output graph::scatter_update(output var, output indices, output updates, const std::string& name) {
  return update("scatter_update", var, {indices, updates}, name);
}

const graph_node* graph::variable_node(output o) const {
  if (!contains(o))
    return nullptr;
  const auto& n = at(o);
  return n.kind == node_kind::variable ? &n : nullptr;
}

output graph::find_variable(const std::string& name) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].kind == node_kind::variable && nodes_[i].name == name)
      return output{static_cast<int32_t>(i)};
  return output{};
}

std::vector<output> graph::variables() const {
  std::vector<output> out;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].kind == node_kind::variable)
      out.push_back(output{static_cast<int32_t>(i)});
  return out;
}

std::vector<std::string> graph::operations() const {
  std::vector<std::string> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_)
    out.push_back(n.name);
  return out;
}

outcome<std::vector<int32_t>> graph::closure(const std::vector<int32_t>& roots) const {
  std::vector<char> seen(nodes_.size(), 0);
  std::vector<int32_t> todo;
  for (auto r : roots) {
    if (!contains(output{r}))
      return graph_error{af_error::invalid_argument,
                         "output " + std::to_string(r)
                           + " is not a node of this graph (an assign to something that is not a "
                             "variable of this session?)"};
    todo.push_back(r);
  }
  while (!todo.empty()) {
    auto id = todo.back();
    todo.pop_back();
    const auto& n = nodes_[static_cast<size_t>(id)];
    // Variables, constants and placeholders are where a step starts.
    if ((n.kind != node_kind::compute && n.kind != node_kind::update) || seen[static_cast<size_t>(id)])
      continue;
    seen[static_cast<size_t>(id)] = 1;
    for (auto in : n.inputs) {
      if (!contains(output{in}))
        return graph_error{af_error::invalid_argument,
                           "op " + quoted(n.name)
                             + " has an invalid input (an assign to something that is not a "
                               "variable of this session?)"};
      todo.push_back(in);
    }
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i < seen.size(); ++i)
    if (seen[i])
      out.push_back(static_cast<int32_t>(i));
  return out;
}

std::string graph::to_string() const {
  std::ostringstream out;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = nodes_[i];
    out << i << ' ' << n.name << " = ";
    switch (n.kind) {
      case node_kind::variable:
        out << "variable " << dtype_name(n.spec.type) << shape_string(n.spec.shape);
        break;
      case node_kind::constant:
        out << "constant " << (n.value.empty() ? std::string{"(empty)"} : n.value.summary());
        break;
      case node_kind::placeholder:
        out << "placeholder";
        break;
      case node_kind::compute:
      case node_kind::update: {
        out << n.op << '(';
        for (size_t k = 0; k < n.inputs.size(); ++k)
          out << (k > 0 ? ", " : "") << n.inputs[k];
        out << ')';
        break;
      }
    }
    auto dev = n.kind == node_kind::variable && !n.spec.device.empty() ? n.spec.device
                                                                         : n.requested.to_string();
    if (!dev.empty())
      out << " @ " << dev;
    out << '\n';
  }
  return out.str();
}

} // namespace af
