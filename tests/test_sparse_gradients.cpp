// The sparse gradient value (issue 25, TF's IndexedSlices): what
// sparse_gradients() gives for a table read through gather, how two of them
// add up, densify() and deduplicate(), evaluated in one process. No cluster.
// Each case names the bug it catches.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "graph/embedding.hpp"
#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shard_routing.hpp"

using namespace af;

namespace {

tensor random64(shape_type shape, uint64_t seed) {
  tensor t{dtype::float64, std::move(shape)};
  REQUIRE(kernels::fill_uniform(t, -1, 1, seed).ok());
  return t;
}

struct table_graph {
  graph g;
  variable_values vars;
  std::unique_ptr<kernels::backend> cpu = kernels::make_cpu_backend();
  output table;

  table_graph() {
    table = *g.variable("emb", {6, 3}, initializer::from_tensor(random64({6, 3}, 1)),
                        dtype::float64);
    REQUIRE(initialize_values(g, vars));
  }

  std::vector<tensor> run(const std::vector<output>& fetches) {
    auto r = evaluate(g, fetches, {}, vars, *cpu);
    if (!r)
      FAIL(r.error().what);
    return *r;
  }

  /// A loss over the rows `ids` names: sum(tanh(rows) * r), r random.
  output loss_of(output rows, shape_type shape, uint64_t seed) {
    return g.reduce_sum(g.mul(g.tanh(rows), g.constant(random64(std::move(shape), seed))));
  }
};

bool has_op(const graph& g, const std::string& op) {
  for (const auto& n : g.nodes())
    if (n.op == op)
      return true;
  return false;
}

} // namespace

TEST_CASE("the gradient of a gathered table is sparse: n ids and n rows, never the "
          "table's shape (catches a gather gradient densified)", "[gradients][sparse]") {
  table_graph t;
  // Ids of rank 2 (a batch of 2 x 3 lookups): the rows are flattened to [6, 3].
  auto ids = tensor::from_values<int64_t>({2, 3}, {4, 0, 4, 1, 4, 0});
  auto loss = t.loss_of(t.g.gather(t.table, t.g.constant(ids)), {2, 3, 3}, 2);
  auto sparse = sparse_gradients(t.g, loss, {t.table});
  REQUIRE(sparse);
  const auto& v = (*sparse)[0];
  REQUIRE(v.is_sparse());
  CHECK(v.dense_like == t.table);
  // Nothing of the table's size was built: no gather_grad, no segment sum.
  CHECK_FALSE(has_op(t.g, "gather_grad"));
  CHECK_FALSE(has_op(t.g, "unsorted_segment_sum"));
  auto got = t.run({v.ids, v.values});
  CHECK(got[0].shape() == shape_type{6});
  CHECK(got[0].values<int64_t>() == std::vector<int64_t>{4, 0, 4, 1, 4, 0});
  CHECK(got[1].shape() == shape_type{6, 3});
  // Densified, it is the dense gradient (which the finite-difference tests check).
  auto dense = gradients(t.g, loss, {t.table});
  REQUIRE(dense);
  auto both = t.run({densify(t.g, v), (*dense)[0]});
  CHECK(both[0].shape() == shape_type{6, 3});
  CHECK(both[0].values<double>() == both[1].values<double>());
}

TEST_CASE("two gathers of one table add up by concatenation, a dense read densifies (catches "
          "the second lookup's rows lost, or a sparse sum densified)", "[gradients][sparse]") {
  table_graph t;
  auto a = tensor::from_values<int32_t>({3}, {1, 5, 1});
  auto b = tensor::from_values<int32_t>({2}, {5, 2});
  auto loss = t.g.add(t.loss_of(t.g.gather(t.table, t.g.constant(a)), {3, 3}, 3),
                      t.loss_of(t.g.gather(t.table, t.g.constant(b)), {2, 3}, 4));
  auto sparse = sparse_gradients(t.g, loss, {t.table});
  REQUIRE(sparse);
  const auto& v = (*sparse)[0];
  REQUIRE(v.is_sparse());
  CHECK_FALSE(has_op(t.g, "gather_grad"));
  auto got = t.run({v.ids, v.values, densify(t.g, v), (*gradients(t.g, loss, {t.table}))[0]});
  CHECK(got[0].values<int32_t>().size() == 5);
  CHECK(got[1].shape() == shape_type{5, 3});
  CHECK(got[2].values<double>() == got[3].values<double>());
  // Rows 0, 3 and 4 are named by no id: zero in the dense gradient.
  for (int r : {0, 3, 4})
    for (int k = 0; k < 3; ++k)
      CHECK(got[2].at(static_cast<size_t>(r * 3 + k)) == 0.0);
  // The table read densely too: its gradient is dense, the sum of both.
  table_graph m;
  auto mixed_loss = m.g.add(m.loss_of(m.g.gather(m.table, m.g.constant(a)), {3, 3}, 3),
                            m.g.reduce_sum(m.g.square(m.table)));
  auto mixed = sparse_gradients(m.g, mixed_loss, {m.table});
  REQUIRE(mixed);
  REQUIRE_FALSE((*mixed)[0].is_sparse());
  auto gathered_only = m.loss_of(m.g.gather(m.table, m.g.constant(a)), {3, 3}, 3);
  auto sparse_part = sparse_gradients(m.g, gathered_only, {m.table});
  REQUIRE(sparse_part);
  auto vals = m.run({(*mixed)[0].dense, densify(m.g, (*sparse_part)[0]), m.table});
  for (size_t i = 0; i < 18; ++i)
    CHECK(vals[0].at(i) == Approx(vals[1].at(i) + 2 * vals[2].at(i)));
}

TEST_CASE("deduplicate sums the rows of a repeated id into one row per id (catches a repeated "
          "id's rows overwritten, or ids reordered away from their rows)", "[gradients][sparse]") {
  graph g;
  auto ids = g.constant(tensor::from_values<int64_t>({5}, {7, 2, 7, 9, 2}));
  auto rows =
    g.constant(tensor::from_values<float>({5, 2}, {1, 2, 10, 20, 100, 200, 5, 6, 30, 40}));
  auto like = g.constant(tensor::filled(dtype::float32, {10, 2}, 0));
  auto d = deduplicate(g, gradient_value::sparse_value(ids, rows, like));
  REQUIRE(d.is_sparse());
  variable_values vars;
  auto cpu = kernels::make_cpu_backend();
  auto r = evaluate(g, {d.ids, d.values, densify(g, d)}, {}, vars, *cpu);
  REQUIRE(r);
  CHECK((*r)[0].values<int64_t>() == std::vector<int64_t>{7, 2, 9});
  CHECK((*r)[1].values<float>() == std::vector<float>{101, 202, 40, 60, 5, 6});
  CHECK((*r)[2].shape() == shape_type{10, 2});
  CHECK((*r)[2].values<float>()[14] == 101);
  // A dense value is left as it is.
  auto dense = g.constant(tensor::scalar(1));
  CHECK(deduplicate(g, gradient_value::dense_value(dense)).dense == dense);
}

TEST_CASE("concat, size and flatten_rows follow TF and refuse what does not fit (catches b's "
          "rows written over a's, a reshape that copies, or mismatched rows concatenated)",
          "[sparse][kernels]") {
  auto cpu = kernels::make_cpu_backend();
  auto a = tensor::from_values<int64_t>({2, 2}, {1, 2, 3, 4});
  auto b = tensor::from_values<int64_t>({1, 2}, {5, 6});
  tensor out;
  REQUIRE(kernels::run_op(*cpu, "concat", {}, {a, b}, out).ok());
  CHECK(out.shape() == shape_type{3, 2});
  CHECK(out.values<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  auto bad = kernels::run_op(*cpu, "concat", {}, {a, tensor::from_values<int64_t>({1, 3}, {1, 2, 3})}, out);
  CHECK_FALSE(bad.ok());
  CHECK(bad.error.find("[2,2] and [1,3]") != std::string::npos);
  CHECK_FALSE(kernels::run_op(*cpu, "concat", {}, {a, tensor::filled(dtype::float32, {1, 2}, 0)}, out).ok());
  REQUIRE(kernels::run_op(*cpu, "size", {}, {a}, out).ok());
  CHECK(out.type() == dtype::int32);
  CHECK(out.values<int32_t>() == std::vector<int32_t>{4});
  auto x = tensor::from_values<float>({2, 2, 3}, std::vector<float>(12, 1.5f));
  REQUIRE(kernels::run_op(*cpu, "flatten_rows", {}, {x, a}, out).ok());
  CHECK(out.shape() == shape_type{4, 3});
  CHECK(out.shares_buffer_with(x));
  REQUIRE(kernels::run_op(*cpu, "flatten_rows", {}, {a, a}, out).ok());
  CHECK(out.shape() == shape_type{4});
  CHECK_FALSE(kernels::run_op(*cpu, "flatten_rows", {}, {b, a}, out).ok());
}

TEST_CASE("each shard of a partitioned table gets a sparse gradient of its own rows (catches a "
          "shard's gradient densified, or rows sent to the wrong shard)",
          "[gradients][sparse][partitioned]") {
  for (auto s : {kernels::partition_strategy::mod, kernels::partition_strategy::div}) {
    INFO(kernels::to_string(s));
    graph g;
    std::vector<device_name> ps;
    for (int k = 0; k < 3; ++k)
      ps.push_back(*device_name::parse("/job:ps/task:" + std::to_string(k)));
    auto t = partitioned_table(g, "emb", {7, 2}, ps, s, initializer::uniform(-1, 1, 5),
                               dtype::float64);
    REQUIRE(t);
    auto ids = g.constant(tensor::from_values<int64_t>({5}, {6, 1, 6, 0, 4}));
    auto rows = embedding_lookup(g, *t, ids);
    REQUIRE(rows);
    auto loss = g.reduce_sum(g.mul(g.square(*rows), g.constant(random64({5, 2}, 6))));
    auto sparse = sparse_gradients(g, loss, t->shards);
    REQUIRE(sparse);
    auto dense = gradients(g, loss, t->shards);
    REQUIRE(dense);
    variable_values vars;
    REQUIRE(initialize_values(g, vars));
    auto cpu = kernels::make_cpu_backend();
    for (size_t k = 0; k < t->shards.size(); ++k) {
      INFO("shard " << k);
      const auto& v = (*sparse)[k];
      REQUIRE(v.is_sparse());
      auto r = evaluate(g, {v.ids, v.values, densify(g, v), (*dense)[k]}, {}, vars, *cpu);
      REQUIRE(r);
      auto shard_rows = g.at(t->shards[k]).spec.shape[0];
      // The shard's own row ids, never more rows than the batch looked up.
      for (auto id : (*r)[0].values<int64_t>())
        CHECK((id >= 0 && id < shard_rows));
      CHECK((*r)[1].shape().size() == 2);
      CHECK((*r)[1].shape()[0] <= 5);
      CHECK((*r)[2].values<double>() == (*r)[3].values<double>());
    }
  }
}
