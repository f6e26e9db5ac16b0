// Partitioned embedding tables (graph/embedding.hpp): declaring the shards and
// building TF's lookup subgraph over them.
#include "graph/embedding.hpp"

#include <algorithm>

namespace af {

namespace {

graph_error invalid(std::string what) {
  return graph_error{af_error::invalid_argument, std::move(what)};
}

/// The device a shard's gather runs on: where its variable was placed (a
/// session fills that in), else where it asked to be.
device_name device_of_shard(const graph_node& v) {
  if (!v.spec.device.empty())
    if (auto d = device_name::parse(v.spec.device))
      return *d;
  return v.requested;
}

/// Puts the caller's scopes back on every path out.
struct scopes_guard {
  explicit scopes_guard(graph& graph_) : g(graph_), saved(graph_.scopes()) {}
  scopes_guard(const scopes_guard&) = delete;
  scopes_guard& operator=(const scopes_guard&) = delete;
  ~scopes_guard() { g.set_scopes(std::move(saved)); }
  graph& g;
  std::vector<device_name> saved;
};

} // namespace

std::vector<output> dynamic_partition(graph& g, output data, output partitions,
                                      int32_t num_partitions, const std::string& name) {
  auto count = g.constant(tensor::from_values<int32_t>({}, {num_partitions}),
                          name + "/num_partitions");
  std::vector<output> out;
  for (int32_t p = 0; p < num_partitions; ++p) {
    auto which = g.constant(tensor::from_values<int32_t>({}, {p}), name + "/partition");
    out.push_back(g.op("dynamic_partition", {data, partitions, count, which}, {}, name));
  }
  return out;
}

output dynamic_stitch(graph& g, const std::vector<output>& indices,
                      const std::vector<output>& data, const std::string& name) {
  std::vector<output> in = indices;
  in.insert(in.end(), data.begin(), data.end());
  return g.op("dynamic_stitch", std::move(in), {}, name);
}

int64_t embedding_table::rows() const {
  int64_t n = 0;
  for (auto r : shard_rows)
    n += r;
  return n;
}

std::string shard_name(const std::string& table, size_t i) {
  return table + "/part_" + std::to_string(i);
}

initializer table_initializer(initializer init) {
  if (init.kind == "uniform" || init.kind == "normal") {
    init.table = true;
    init.row_start = 0;
    init.row_stride = 1;
  }
  return init;
}

initializer shard_initializer(initializer init, kernels::partition_strategy strategy,
                              const std::vector<int64_t>& shard_rows, size_t k) {
  init = table_initializer(std::move(init));
  if (!init.table)
    return init;
  if (strategy == kernels::partition_strategy::mod) {
    init.row_start = static_cast<int64_t>(k);
    init.row_stride = static_cast<int64_t>(shard_rows.size());
  } else {
    int64_t start = 0;
    for (size_t i = 0; i < k && i < shard_rows.size(); ++i)
      start += shard_rows[i];
    init.row_start = start;
  }
  return init;
}

outcome<embedding_table> embedding_table_of(const graph& g, const std::string& name,
                                            kernels::partition_strategy strategy,
                                            std::vector<output> shards) {
  if (shards.empty())
    return invalid("table '" + name + "' has no shard");
  embedding_table t;
  t.name = name;
  t.strategy = strategy;
  const graph_node* first = g.variable_node(shards.front());
  for (size_t i = 0; i < shards.size(); ++i) {
    const graph_node* v = g.variable_node(shards[i]);
    if (v == nullptr)
      return invalid("table '" + name + "': shard " + std::to_string(i) + " is not a variable");
    const auto &shape = v->spec.shape, &first_shape = first->spec.shape;
    bool same_rows = shape.size() == first_shape.size() && !shape.empty()
                     && std::equal(shape.begin() + 1, shape.end(), first_shape.begin() + 1);
    if (v->spec.type != first->spec.type || !same_rows)
      return invalid("table '" + name + "': shard '" + v->name + "' is "
                     + dtype_name(v->spec.type) + shape_string(shape) + ", shard '" + first->name
                     + "' " + dtype_name(first->spec.type) + shape_string(first_shape)
                     + ": shards need one dtype and one row shape");
    t.shard_rows.push_back(shape[0]);
  }
  kernels::shard_router router;
  if (auto st = kernels::shard_router::make(strategy, t.shard_rows, router); !st.ok())
    return invalid("table '" + name + "': " + st.error);
  for (size_t i = 0; i < shards.size(); ++i) {
    const graph_node* v = g.variable_node(shards[i]);
    if (!v->init.table)
      continue;
    auto want = shard_initializer(v->init, strategy, t.shard_rows, i);
    if (want.row_start != v->init.row_start || want.row_stride != v->init.row_stride)
      return invalid("table '" + name + "': shard " + std::to_string(i) + " ('" + v->name
                     + "') is initialized as the table's rows from "
                     + std::to_string(v->init.row_start) + " by "
                     + std::to_string(v->init.row_stride) + ", but " + kernels::to_string(strategy)
                     + " gives it the rows from " + std::to_string(want.row_start) + " by "
                     + std::to_string(want.row_stride)
                     + " (make shard k with shard_initializer(init, strategy, sizes, k))");
  }
  t.shards = std::move(shards);
  return t;
}

outcome<embedding_table> partitioned_table(graph& g, const std::string& name, shape_type shape,
                                           const std::vector<device_name>& devices,
                                           kernels::partition_strategy strategy,
                                           initializer init, dtype type,
                                           std::vector<int64_t> shard_rows) {
  if (shape.empty() || devices.empty())
    return invalid("table '" + name + "' needs a shape [rows, ...] and at least one device, got "
                   + shape_string(shape) + " and " + std::to_string(devices.size())
                   + " device(s)");
  auto n = static_cast<int64_t>(devices.size());
  if (strategy != kernels::partition_strategy::contiguous || shard_rows.empty())
    shard_rows = kernels::balanced_shard_rows(shape[0], n);
  if (static_cast<int64_t>(shard_rows.size()) != n)
    return invalid("table '" + name + "': " + std::to_string(shard_rows.size())
                   + " shard sizes for " + std::to_string(n) + " devices");
  int64_t total = 0;
  for (auto r : shard_rows)
    total += r;
  if (total != shape[0])
    return invalid("table '" + name + "': the shards' rows add up to " + std::to_string(total)
                   + ", the table has " + std::to_string(shape[0]));
  std::vector<output> shards;
  {
    scopes_guard guard{g};
    for (size_t i = 0; i < devices.size(); ++i) {
      g.set_scopes({devices[i]});
      auto piece = shape;
      piece[0] = shard_rows[i];
      auto v = g.variable(shard_name(name, i), piece,
                          shard_initializer(init, strategy, shard_rows, i), type);
      if (!v)
        return v.error();
      shards.push_back(*v);
    }
  }
  return embedding_table_of(g, name, strategy, std::move(shards));
}

outcome<output> embedding_lookup(graph& g, const embedding_table& t, output ids,
                                 const std::string& name) {
  if (t.shards.empty() || t.shards.size() != t.shard_rows.size())
    return invalid("embedding_lookup: table '" + t.name + "' is not declared (no shards)");
  for (auto s : t.shards)
    if (g.variable_node(s) == nullptr)
      return invalid("embedding_lookup: a shard of table '" + t.name
                     + "' is not a variable of this graph");
  if (!g.contains(ids))
    return invalid("embedding_lookup of table '" + t.name + "': ids are not an op of this graph");
  const auto n = static_cast<int32_t>(t.shards.size());
  const std::string base = name.empty() ? t.name + "/lookup" : name;
  // On the caller's device: dedupe, route each distinct id, split by shard.
  auto unique_ids = g.op("unique", {ids}, {}, base + "/unique");
  auto batch_order = g.op("unique_idx", {ids}, {}, base + "/unique_idx");
  auto layout = g.constant(tensor::from_values<int64_t>({n}, t.shard_rows), base + "/shard_rows");
  auto strategy = g.constant(
    tensor::from_values<int32_t>({}, {static_cast<int32_t>(t.strategy)}), base + "/strategy");
  // Named after the table: a bad id's error names the op, so the table.
  auto shard = g.op("shard_of", {unique_ids, layout, strategy}, {}, t.name + "/route");
  auto row = g.op("row_in_shard", {unique_ids, layout, strategy}, {}, t.name + "/route_row");
  auto positions = g.op("range", {g.op("size", {unique_ids}, {}, base + "/size")}, {},
                        base + "/positions");
  auto rows_of = dynamic_partition(g, row, shard, n, base + "/rows_of");
  auto positions_of = dynamic_partition(g, positions, shard, n, base + "/positions_of");
  // One gather per shard, where the shard lives: only the rows named travel.
  std::vector<output> gathered;
  {
    scopes_guard guard{g};
    for (int32_t s = 0; s < n; ++s) {
      g.set_scopes({device_of_shard(*g.variable_node(t.shards[static_cast<size_t>(s)]))});
      gathered.push_back(g.gather(t.shards[static_cast<size_t>(s)], rows_of[static_cast<size_t>(s)],
                                  base + "/gather_" + std::to_string(s)));
    }
  }
  // Back on the caller's device: the unique ids' order, then the batch's.
  auto stitched = dynamic_stitch(g, positions_of, gathered, base + "/stitch");
  return g.gather(stitched, batch_order, base);
}

} // namespace af
