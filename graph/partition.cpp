#include "graph/partition.hpp"

#include <algorithm>
#include <set>
#include <utility>

namespace af {

std::string plan_signature(const std::vector<int32_t>& roots, bool want_values) {
  std::string signature = want_values ? "v" : "t";
  for (auto r : roots)
    signature += ":" + std::to_string(r);
  return signature;
}

outcome<step_plan> partition(const graph& g, const std::vector<int32_t>& roots, bool want_values,
                             const op_placer& place_op) {
  auto closure = g.closure(roots);
  if (!closure)
    return closure.error();
  step_plan plan;
  plan.roots = roots;
  plan.want_values = want_values;
  std::map<std::string, size_t> index;                   // full device -> partition
  std::map<int32_t, std::pair<size_t, size_t>> planned;  // node -> (partition, op index)
  std::set<int32_t> root_set(roots.begin(), roots.end());
  auto placed_variable = [&](int32_t id, const graph_node& user) -> outcome<placed_device> {
    const auto& var = g.at(output{id});
    if (var.spec.device.empty())
      return graph_error{af_error::invalid_argument,
                         "op '" + user.name + "': variable '" + var.name
                           + "' has not been placed (its spec has no device)"};
    auto p = placed_from_full(var.spec.device);
    if (!p)
      return graph_error{p.error().code, "op '" + user.name + "': variable '" + var.name
                                           + "': " + p.error().what};
    return p;
  };
  for (auto id : *closure) { // ascending ids: a topological order
    const auto& n = g.at(output{id});
    placed_device where;
    if (n.kind == node_kind::update) {
      // An update runs where its variable lives.
      if (n.inputs.size() < 2 || g.variable_node(output{n.inputs[0]}) == nullptr)
        return graph_error{af_error::invalid_argument,
                           "op '" + n.name + "' (" + n.op + ") does not update a variable"};
      auto p = placed_variable(n.inputs[0], n);
      if (!p)
        return p.error();
      where = std::move(*p);
    } else {
      auto p = place_op(n);
      if (!p) {
        // Name the op, unless the placer already did.
        auto prefix = "op '" + n.name + "': ";
        const auto& what = p.error().what;
        return graph_error{p.error().code, what.rfind(prefix, 0) == 0 ? what : prefix + what};
      }
      where = std::move(*p);
    }
    auto [it, fresh] = index.emplace(where.full, plan.partitions.size());
    if (fresh) {
      plan.partitions.emplace_back();
      plan.partitions.back().device = where;
    }
    auto part = it->second;
    plan.partition_of[id] = part;
    planned_op op;
    op.id = id;
    op.op = n.op;
    op.name = n.name;
    op.attrs = n.attrs;
    bool is_root = root_set.count(id) > 0;
    op.fetch = want_values && is_root;
    // An update that nothing reads and nobody fetches need not send its value back.
    op.want_value = n.kind != node_kind::update || op.fetch || !is_root;
    for (auto in : n.inputs) {
      const auto& src = g.at(output{in});
      planned_input x;
      x.node = in;
      switch (src.kind) {
        case node_kind::variable: {
          auto p = placed_variable(in, n);
          if (!p)
            return p.error();
          x.kind = planned_input::variable;
          break;
        }
        case node_kind::constant:
          x.kind = planned_input::constant;
          break;
        case node_kind::placeholder: {
          x.kind = planned_input::feed;
          auto& feeds = plan.partitions[part].feeds;
          if (std::find(feeds.begin(), feeds.end(), in) == feeds.end())
            feeds.push_back(in);
          break;
        }
        case node_kind::compute:
        case node_kind::update: {
          auto [producer, index_in_part] = planned.at(in);
          if (producer == part) {
            x.kind = planned_input::local;
          } else {
            x.kind = planned_input::remote;
            x.from = producer;
            // The producer sends its value here, partition to partition, once.
            auto& consumers = plan.partitions[producer].ops[index_in_part].consumers;
            if (std::find(consumers.begin(), consumers.end(), part) == consumers.end())
              consumers.push_back(part);
          }
          break;
        }
      }
      op.inputs.push_back(x);
    }
    planned[id] = {part, plan.partitions[part].ops.size()};
    plan.partitions[part].ops.push_back(std::move(op));
  }
  return plan;
}

} // namespace af
