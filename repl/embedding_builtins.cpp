// The REPL's functions of sparse training (issue 25, docs/sparse.md):
// partitioned_table declares a table cut over ps devices, embedding_lookup
// looks ids up in one table or a partitioned one (TF's
// tf.nn.embedding_lookup(params, ids, partition_strategy)), and
// sparse_gradients shows a lookup's gradient as what it is: the ids touched
// and their rows (TF's IndexedSlices), never the table's shape.

#include <fmt/format.h>

#include "repl/interpreter_state.hpp"

#include "graph/embedding.hpp"

namespace af::repl {

namespace {

/// "emb/part_0" -> "emb": the table a shard variable belongs to.
std::string table_of_shard(const std::string& shard) {
  auto slash = shard.rfind("/part_");
  return slash == std::string::npos ? shard : shard.substr(0, slash);
}

} // namespace

kernels::partition_strategy interpreter::state::strategy_arg(const args_view& a,
                                                             kernels::partition_strategy fallback) {
  position at = a.at;
  const auto* v = a.get(size_t(-1), "strategy", &at);
  if (v == nullptr)
    v = a.get(size_t(-1), "partition_strategy", &at);
  if (v == nullptr)
    return fallback;
  auto s = v->what == value::kind::text ? kernels::parse_partition_strategy(v->text)
                                        : std::nullopt;
  if (!s)
    fail(at, a.fn + ": strategy is \"mod\" (TF's default: id p on shard p % n), \"div\" or "
                    "\"contiguous\" (runs of ids)");
  return *s;
}

value interpreter::state::call_partitioned_table(const args_view& a) {
  auto& s = sess();
  check_arity(a, 3, 4, {"name", "shape", "devices", "init", "strategy", "dtype"});
  auto name = text_arg(a, 0, "name", "the table's name");
  position shape_at = a.at, devices_at = a.at, init_at = a.at;
  auto shape = shape_arg(*a.get(1, "shape", &shape_at), shape_at, a.fn);
  if (shape.empty() || shape.size() > 8)
    fail(shape_at, a.fn + ": a table's shape is [rows, dim, ...], 1 to 8 dimensions");
  const value* dv = a.get(2, "devices", &devices_at);
  if (dv == nullptr || dv->what != value::kind::list || dv->items.empty())
    fail(devices_at, a.fn + ": devices is a [list] of device strings, one per shard, such as "
                            "[\"/job:ps/task:0\", \"/job:ps/task:1\"]");
  auto type = dtype_arg(a);
  auto strategy = strategy_arg(a, kernels::partition_strategy::mod);
  auto n = static_cast<int64_t>(dv->items.size());
  auto rows = kernels::balanced_shard_rows(shape[0], n);
  initializer init = initializer::zeros();
  if (const value* iv = a.get(3, "init", &init_at)) {
    if (iv->what == value::kind::tensor || iv->what == value::kind::list)
      fail(init_at, a.fn + ": a table starts from a number, zeros(), ones(), uniform(...) or "
                           "normal(...), not a tensor (each shard would need its own rows)");
    init = init_arg(*iv, init_at, shape, true, type);
  }
  std::vector<output> shards;
  value out;
  out.what = value::kind::list;
  for (int64_t k = 0; k < n; ++k) {
    const auto& d = dv->items[static_cast<size_t>(k)];
    if (d.what != value::kind::text)
      fail(devices_at, a.fn + ": device " + std::to_string(k) + " must be \"text\" such as "
                              "\"/job:ps/task:0\", got " + kind_name(d.what));
    auto scope = s.device(d.text);
    if (!scope)
      fail(devices_at, a.fn + ": " + describe(scope.error()));
    auto piece = shape;
    piece[0] = rows[static_cast<size_t>(k)];
    // A random initializer names the shard's global rows: each shard holds
    // its rows of the one-piece table, not the same stream of the seed.
    auto v = s.variable(shard_name(name, static_cast<size_t>(k)), piece,
                        shard_initializer(init, strategy, rows, static_cast<size_t>(k)), type);
    if (!v)
      fail(a.at, describe(v.error()));
    shards.push_back(*v);
    out.items.push_back(node_value(*v, shard_name(name, static_cast<size_t>(k))));
  }
  auto table = embedding_table_of(s.graph_def(), name, strategy, shards);
  if (!table)
    fail(a.at, a.fn + ": " + table.error().what);
  current->table_strategies[name] = strategy;
  return out;
}

value interpreter::state::call_embedding_lookup(const args_view& a) {
  auto& s = sess();
  check_arity(a, 2, 2, {"params", "ids", "strategy", "partition_strategy"});
  position params_at = a.at, ids_at = a.at;
  const value* params = a.get(0, "params", &params_at);
  auto ids = to_node(*a.get(1, "ids", &ids_at), ids_at, dtype::int64);
  if (params->what != value::kind::list || is_numeric_list(*params)) // one table: a gather
    return node_value(s.embedding_lookup(to_node(*params, params_at), ids), "");
  // A partitioned table: its shard variables, in the strategy's order.
  std::vector<output> shards;
  for (const auto& p : params->items)
    shards.push_back(to_node(p, params_at));
  const auto* first = s.graph_def().variable_node(shards[0]);
  if (first == nullptr)
    fail(params_at, a.fn + ": the shards of a table are variables (partitioned_table(...) "
                           "gives them); '" + params->items[0].source + "' is not one");
  auto name = table_of_shard(first->spec.name);
  auto known = current->table_strategies.find(name);
  auto strategy = strategy_arg(a, known != current->table_strategies.end()
                                    ? known->second : kernels::partition_strategy::mod);
  // A table's rows are where its declaration put them: a lookup by another
  // strategy would route ids to other ids' rows.
  if (known != current->table_strategies.end() && strategy != known->second)
    fail(a.at, fmt::format("{}: table '{}' was declared with strategy=\"{}\": a lookup routes "
                           "by it (pass no strategy, or \"{}\")",
                           a.fn, name, kernels::to_string(known->second),
                           kernels::to_string(known->second)));
  auto table = embedding_table_of(s.graph_def(), name, strategy, shards);
  if (!table)
    fail(params_at, a.fn + ": " + table.error().what);
  auto rows = embedding_lookup(s.builder(), *table, ids);
  if (!rows)
    fail(a.at, a.fn + ": " + rows.error().what);
  return node_value(*rows, "");
}

value interpreter::state::call_sparse_gradients(const args_view& a) {
  check_arity(a, 2, 2, {});
  auto loss = to_node(a.positional[0], a.positional_at[0]);
  const auto& xv = a.positional[1];
  // A partitioned table inside the list is its shards: one gradient each.
  std::vector<output> xs;
  std::vector<std::string> names;
  auto add = [&](const value& x) {
    xs.push_back(to_node(x, a.positional_at[1]));
    names.push_back(x.source);
  };
  bool one = xv.what != value::kind::list;
  if (one)
    add(xv);
  for (const auto& x : xv.items) {
    if (x.what == value::kind::list)
      for (const auto& shard : x.items)
        add(shard);
    else
      add(x);
  }
  auto g = sparse_gradients(sess().builder(), loss, xs);
  if (!g)
    fail(a.at, g.error().what);
  value out;
  out.what = value::kind::list;
  for (size_t i = 0; i < g->size(); ++i) {
    const auto& gv = (*g)[i];
    auto label = "d(" + a.positional[0].source + ")/d(" + names[i] + ")";
    value item;
    if (gv.is_sparse()) { // [ids, values]: the rows touched and their gradients
      item.what = value::kind::list;
      item.source = label;
      item.items = {node_value(gv.ids, label + " ids"), node_value(gv.values, label + " values")};
    } else {
      item = node_value(gv.dense, label + " (dense)");
    }
    if (one)
      return item;
    out.items.push_back(std::move(item));
  }
  return out;
}

} // namespace af::repl
