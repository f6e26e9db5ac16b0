// Partitioned embedding tables at the graph level (issue 25, section 2;
// docs/sparse.md "Partitioned tables"): the mod and div routing of TF's
// embedding_lookup against hand-computed examples with uneven shards,
// dynamic_partition and dynamic_stitch with TF's semantics, and the lookup
// subgraph (graph/embedding.hpp) against a gather of the unpartitioned
// table, forward and backward, in one process. Each case says which bug it
// catches.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "graph/embedding.hpp"
#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shard_routing.hpp"

using namespace af;
using kernels::partition_strategy;
using kernels::shard_place;
using kernels::shard_router;

namespace {

shard_router router_of(partition_strategy s, std::vector<int64_t> rows) {
  shard_router r;
  auto st = shard_router::make(s, std::move(rows), r);
  INFO(st.error);
  REQUIRE(st.ok());
  return r;
}

/// A [rows, cols] float64 table with value r * 10 + c at (r, c): a row names its id.
tensor table(int64_t rows, int64_t cols) {
  std::vector<double> v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v.push_back(static_cast<double>(r * 10 + c));
  return tensor::from_values<double>({rows, cols}, v);
}

/// The global ids each shard holds, in its row order, written out per
/// strategy without the router (mod: s, s + n, ...; otherwise runs).
std::vector<std::vector<int64_t>> ids_of_shards(partition_strategy s,
                                                const std::vector<int64_t>& rows) {
  std::vector<std::vector<int64_t>> out(rows.size());
  int64_t next = 0;
  for (size_t k = 0; k < rows.size(); ++k)
    for (int64_t r = 0; r < rows[k]; ++r)
      out[k].push_back(s == partition_strategy::mod
                         ? r * static_cast<int64_t>(rows.size()) + static_cast<int64_t>(k)
                         : next++);
  return out;
}

/// The rows `ids` of `full`, a shard's value.
tensor rows_of(const tensor& full, const std::vector<int64_t>& ids) {
  auto cols = full.shape()[1];
  std::vector<double> v;
  for (auto id : ids)
    for (int64_t c = 0; c < cols; ++c)
      v.push_back(full.data<double>()[id * cols + c]);
  return tensor::from_values<double>({static_cast<int64_t>(ids.size()), cols}, v);
}

std::vector<device_name> ps_devices(size_t n) {
  std::vector<device_name> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(*device_name::parse("/job:ps/task:" + std::to_string(i)));
  return out;
}

/// A table of `full`'s shape cut by `s` over `n` ps (contiguous: `rows`),
/// its shards' values set in `vars` from `full`.
embedding_table declare(graph& g, const std::string& name, const tensor& full, size_t n,
                        partition_strategy s, variable_values& vars,
                        std::vector<int64_t> rows = {}) {
  auto t = partitioned_table(g, name, full.shape(), ps_devices(n), s, initializer::zeros(),
                             dtype::float64, std::move(rows));
  if (!t)
    FAIL(t.error().what);
  auto held = ids_of_shards(s, t->shard_rows);
  for (size_t k = 0; k < n; ++k)
    vars[shard_name(name, k)] = rows_of(full, held[k]);
  return *t;
}

outcome<std::vector<tensor>> run(const graph& g, const std::vector<output>& ys,
                                 variable_values& vars) {
  auto cpu = kernels::make_cpu_backend();
  return evaluate(g, ys, {}, vars, *cpu);
}

void check_close(const tensor& got, const tensor& want, double tol) {
  REQUIRE(got.shape() == want.shape());
  for (size_t i = 0; i < want.num_elements(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(got.data<double>()[i] - want.data<double>()[i]) <= tol);
  }
}

} // namespace

// -- routing --------------------------------------------------------------------------

TEST_CASE("mod and div route the ids of an uneven table (13 rows over 5 shards) as TF does "
          "(catches a div that ignores TF's extras, putting ids past the longer shards on the wrong shard)",
          "[partitioned][routing]") {
  // TF's embedding_lookup docstring: 13 ids over 5 partitions, div gives
  // [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]; mod gives
  // [[0, 5, 10], [1, 6, 11], [2, 7, 12], [3, 8], [4, 9]].
  CHECK(kernels::balanced_shard_rows(13, 5) == std::vector<int64_t>{3, 3, 3, 2, 2});
  auto div = router_of(partition_strategy::div, {3, 3, 3, 2, 2});
  std::vector<shard_place> want_div = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}, {2, 0},
                                       {2, 1}, {2, 2}, {3, 0}, {3, 1}, {4, 0}, {4, 1}};
  auto mod = router_of(partition_strategy::mod, {3, 3, 3, 2, 2});
  std::vector<shard_place> want_mod = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {0, 1}, {1, 1},
                                       {2, 1}, {3, 1}, {4, 1}, {0, 2}, {1, 2}, {2, 2}};
  for (int64_t id = 0; id < 13; ++id) {
    INFO("id " << id);
    CHECK(div.place(id) == want_div[static_cast<size_t>(id)]);
    CHECK(mod.place(id) == want_mod[static_cast<size_t>(id)]);
  }
  CHECK_FALSE(div.contains(13));
  CHECK_FALSE(div.contains(-1));
  // Fewer rows than shards: TF's ids_per_partition is 0 (its formula would
  // divide by zero); each id is one row of the first shards.
  auto tiny = router_of(partition_strategy::div, {1, 1, 0});
  CHECK(tiny.place(0) == shard_place{0, 0});
  CHECK(tiny.place(1) == shard_place{1, 0});
  // 10 rows over 4: [3, 3, 2, 2]; id 6 is the first of shard 2, id 5 the last of shard 1.
  auto ten = router_of(partition_strategy::div, kernels::balanced_shard_rows(10, 4));
  CHECK(ten.place(5) == shard_place{1, 2});
  CHECK(ten.place(6) == shard_place{2, 0});
  CHECK(ten.place(9) == shard_place{3, 1});
  // contiguous: any sizes, an empty shard skipped.
  auto pieces = router_of(partition_strategy::contiguous, {4, 0, 2});
  CHECK(pieces.place(3) == shard_place{0, 3});
  CHECK(pieces.place(4) == shard_place{2, 0});
  CHECK(pieces.place(5) == shard_place{2, 1});
}

TEST_CASE("mod and div refuse shards not of TF's sizes, naming the sizes they need "
          "(catches ids routed past the end of a shard)", "[partitioned][routing]") {
  shard_router r;
  auto st = shard_router::make(partition_strategy::div, {2, 3, 3}, r);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error.find("needs shards of [3, 3, 2] rows") != std::string::npos);
  CHECK_FALSE(shard_router::make(partition_strategy::mod, {}, r).ok());
  CHECK(shard_router::make(partition_strategy::contiguous, {2, 3, 3}, r).ok());
}

TEST_CASE("shard sizes that add up past int64 are refused, and one shard of 2^63 - 1 rows "
          "routes by div (issue 25 F5, a signed overflow garbled the error)",
          "[partitioned][routing]") {
  shard_router r;
  auto st = shard_router::make(partition_strategy::contiguous, {INT64_MAX, INT64_MAX}, r);
  REQUIRE_FALSE(st.ok());
  INFO(st.error);
  CHECK(st.error.find("add up to more than 2^63 - 1 rows") != std::string::npos);
  CHECK(st.error.find('\0') == std::string::npos);
  CHECK_FALSE(shard_router::make(partition_strategy::mod, {INT64_MAX, 1}, r).ok());
  auto one = router_of(partition_strategy::div, {INT64_MAX});
  CHECK(one.place(INT64_MAX - 1) == shard_place{0, INT64_MAX - 1});
  CHECK(one.place(5) == shard_place{0, 5});
}

TEST_CASE("shard_of names a bad STRATEGY's value and the allowed ones, and the sizes that "
          "overflow", "[partitioned][routing]") {
  graph g;
  auto ids = g.constant(tensor::from_values<int64_t>({1}, {INT64_MAX}));
  auto run = [&](tensor rows, tensor strategy) {
    variable_values vars;
    auto cpu = kernels::make_cpu_backend();
    auto y = g.op("shard_of", {ids, g.constant(std::move(rows)), g.constant(std::move(strategy))});
    auto r = evaluate(g, {y}, {}, vars, *cpu);
    REQUIRE_FALSE(r);
    return r.error().what;
  };
  auto rows = tensor::from_values<int64_t>({2}, {3, 3});
  for (int32_t bad : {-1, 7}) {
    auto what = run(rows, tensor::from_values<int32_t>({}, {bad}));
    INFO(what);
    CHECK(what.find("shard_of: STRATEGY = " + std::to_string(bad)
                    + " is not a partition strategy: 0 (mod), 1 (div) or 2 (contiguous)")
          != std::string::npos);
  }
  CHECK(run(rows, tensor::scalar(1.0f)).find("STRATEGY must be one int") != std::string::npos);
  auto what = run(tensor::from_values<int64_t>({2}, {INT64_MAX, INT64_MAX}),
                  tensor::from_values<int32_t>({}, {0}));
  INFO(what);
  CHECK(what.find("shard_of: the shard sizes [9223372036854775807, 9223372036854775807] add up "
                  "to more than 2^63 - 1 rows") != std::string::npos);
}

// -- dynamic_partition, dynamic_stitch ------------------------------------------------

TEST_CASE("dynamic_partition keeps each partition's slices in order and refuses an id out of "
          "range naming it and its position (catches a write past the outputs)",
          "[partitioned][dynamic_partition]") {
  graph g;
  auto data = g.constant(table(5, 2));
  auto parts = g.constant(tensor::from_values<int32_t>({5}, {1, 0, 2, 1, 0}));
  auto out = dynamic_partition(g, data, parts, 3);
  REQUIRE(out.size() == 3);
  variable_values vars;
  auto r = run(g, out, vars);
  REQUIRE(r);
  check_close((*r)[0], tensor::from_values<double>({2, 2}, {10, 11, 40, 41}), 0);
  check_close((*r)[1], tensor::from_values<double>({2, 2}, {0, 1, 30, 31}), 0);
  check_close((*r)[2], tensor::from_values<double>({1, 2}, {20, 21}), 0);
  auto bad = g.constant(tensor::from_values<int64_t>({5}, {0, 1, 5, 1, 0}));
  auto r2 = run(g, {dynamic_partition(g, data, bad, 3)[1]}, vars);
  REQUIRE_FALSE(r2);
  CHECK(r2.error().what.find("partitions[2] = 5 is not in [0, 3)") != std::string::npos);
}

TEST_CASE("dynamic_stitch merges by index as TF's example does, a later index overwriting an "
          "earlier one (catches a stitch in input order, or first-write-wins)",
          "[partitioned][dynamic_stitch]") {
  graph g;
  // TF's DynamicStitch documentation example.
  auto i0 = g.constant(tensor::from_values<int32_t>({}, {6}));
  auto i1 = g.constant(tensor::from_values<int32_t>({2}, {4, 1}));
  auto i2 = g.constant(tensor::from_values<int32_t>({2, 2}, {5, 2, 0, 3}));
  auto d0 = g.constant(tensor::from_values<double>({2}, {61, 62}));
  auto d1 = g.constant(tensor::from_values<double>({2, 2}, {41, 42, 11, 12}));
  auto d2 = g.constant(tensor::from_values<double>({2, 2, 2}, {51, 52, 21, 22, 1, 2, 31, 32}));
  auto merged = dynamic_stitch(g, {i0, i1, i2}, {d0, d1, d2});
  // Overwrite: indices[0] = [0, 1], indices[1] = [1] -> row 1 from data[1].
  auto o0 = g.constant(tensor::from_values<int64_t>({2}, {0, 1}));
  auto o1 = g.constant(tensor::from_values<int64_t>({1}, {1}));
  auto over = dynamic_stitch(g, {o0, o1}, {g.constant(tensor::from_values<double>({2, 1}, {7, 8})),
                                           g.constant(tensor::from_values<double>({1, 1}, {9}))});
  variable_values vars;
  auto r = run(g, {merged, over}, vars);
  REQUIRE(r);
  check_close((*r)[0], tensor::from_values<double>({7, 2}, {1, 2, 11, 12, 21, 22, 31, 32, 41, 42,
                                                            51, 52, 61, 62}), 0);
  check_close((*r)[1], tensor::from_values<double>({2, 1}, {7, 9}), 0);
  auto neg = dynamic_stitch(g, {g.constant(tensor::from_values<int32_t>({1}, {-1}))}, {d0});
  auto r2 = run(g, {neg}, vars);
  CHECK_FALSE(r2);
}

// -- the lookup -----------------------------------------------------------------------

TEST_CASE("a partitioned lookup equals a gather of the unpartitioned table for mod, div and "
          "contiguous, with duplicate ids in any order (catches rows stitched back in shard "
          "order, or duplicates dropped)", "[partitioned][lookup]") {
  auto full = table(13, 3);
  struct layout {
    partition_strategy s;
    size_t shards;
    std::vector<int64_t> rows;
  };
  for (const auto& l : {layout{partition_strategy::mod, 5, {}}, layout{partition_strategy::div, 5, {}},
                        layout{partition_strategy::div, 4, {}},
                        layout{partition_strategy::contiguous, 3, {6, 0, 7}}}) {
    INFO(kernels::to_string(l.s) << " over " << l.shards);
    graph g;
    variable_values vars;
    auto t = declare(g, "emb", full, l.shards, l.s, vars, l.rows);
    for (bool wide : {true, false}) {
      std::vector<int64_t> ids = {12, 0, 7, 7, 3, 12, 9, 1, 5};
      auto id_tensor = wide ? tensor::from_values<int64_t>({9}, ids)
                            : tensor::from_values<int32_t>({9}, {12, 0, 7, 7, 3, 12, 9, 1, 5});
      auto in = g.constant(id_tensor);
      auto y = embedding_lookup(g, t, in);
      REQUIRE(y);
      auto r = run(g, {*y, g.gather(g.constant(full), in)}, vars);
      if (!r)
        FAIL(r.error().what);
      check_close((*r)[0], (*r)[1], 0);
      check_close((*r)[0], rows_of(full, ids), 0);
    }
  }
}

TEST_CASE("a partitioned lookup refuses an id outside the table naming the id and the table "
          "(catches an id routed to a shard that then reads another row)",
          "[partitioned][lookup]") {
  graph g;
  variable_values vars;
  auto t = declare(g, "user_emb", table(13, 2), 5, partition_strategy::div, vars);
  auto y = embedding_lookup(g, t, g.constant(tensor::from_values<int64_t>({3}, {2, 13, 0})));
  REQUIRE(y);
  auto r = run(g, {*y}, vars);
  REQUIRE_FALSE(r);
  INFO(r.error().what);
  CHECK(r.error().what.find("'user_emb/route'") != std::string::npos);
  CHECK(r.error().what.find("= 13 is not a row of the table: not in [0, 13)") != std::string::npos);
  auto neg = embedding_lookup(g, t, g.constant(tensor::from_values<int32_t>({1}, {-2})));
  auto r2 = run(g, {*neg}, vars);
  REQUIRE_FALSE(r2);
  CHECK(r2.error().what.find("= -2 is not a row") != std::string::npos);
}

TEST_CASE("each shard's gather is placed on its shard's device, the routing on the caller's "
          "(catches a lookup that pulls whole shards to the worker)", "[partitioned][lookup]") {
  graph g;
  variable_values vars;
  auto t = declare(g, "emb", table(7, 2), 3, partition_strategy::mod, vars);
  g.push_scope(*device_name::parse("/job:worker/task:0"));
  auto y = embedding_lookup(g, t, g.constant(tensor::from_values<int64_t>({2}, {1, 2})));
  REQUIRE(y);
  for (size_t s = 0; s < 3; ++s) {
    INFO("shard " << s);
    CHECK(g.at(t.shards[s]).requested.to_string() == ps_devices(3)[s].to_string());
    bool found = false;
    for (const auto& n : g.nodes())
      if (n.name == "emb/lookup/gather_" + std::to_string(s)) {
        found = true;
        CHECK(n.requested.to_string() == ps_devices(3)[s].to_string());
        CHECK(n.inputs.at(0) == t.shards[s].id);
      }
    CHECK(found);
  }
  auto worker = device_name::parse("/job:worker/task:0")->to_string();
  CHECK(g.at(*y).requested.to_string() == worker);
  CHECK(g.current_scope().to_string() == worker); // the caller's scope is back
}

TEST_CASE("the gradient of a partitioned lookup is, shard by shard, the unpartitioned table's "
          "gradient at the shard's rows, for mod and div with duplicate ids (catches gradients "
          "routed to the wrong shard or row, or a duplicate counted once)",
          "[partitioned][lookup][gradients]") {
  auto full = table(11, 3);
  for (auto s : {partition_strategy::mod, partition_strategy::div}) {
    INFO(kernels::to_string(s));
    graph g;
    variable_values vars;
    auto t = declare(g, "emb", full, 4, s, vars);
    auto whole = g.variable("whole", {11, 3}, initializer::zeros(), dtype::float64);
    REQUIRE(whole);
    vars["whole"] = full;
    auto ids = g.constant(tensor::from_values<int64_t>({7}, {10, 3, 3, 0, 7, 10, 3}));
    std::vector<double> w;
    for (int i = 0; i < 21; ++i)
      w.push_back(0.25 * i - 2);
    auto weights = g.constant(tensor::from_values<double>({7, 3}, w));
    auto y = embedding_lookup(g, t, ids);
    REQUIRE(y);
    // A loss with a square, so the gradient depends on the rows' values too.
    auto loss = g.reduce_sum(g.mul(g.square(*y), weights));
    auto ref = g.reduce_sum(g.mul(g.square(g.gather(*whole, ids)), weights));
    auto grads = gradients(g, loss, t.shards);
    if (!grads)
      FAIL(grads.error().what);
    auto ref_grad = gradients(g, ref, {*whole});
    REQUIRE(ref_grad);
    std::vector<output> fetch = *grads;
    fetch.push_back(ref_grad->front());
    auto r = run(g, fetch, vars);
    if (!r)
      FAIL(r.error().what);
    const tensor& want = r->back();
    auto held = ids_of_shards(s, t.shard_rows);
    for (size_t k = 0; k < t.shards.size(); ++k) {
      INFO("shard " << k);
      check_close((*r)[k], rows_of(want, held[k]), 1e-6);
    }
    // The shard gradients differ from zero exactly where the batch's ids are.
    CHECK(want.data<double>()[10 * 3] != 0);
    CHECK(want.data<double>()[1 * 3] == 0);
  }
}

TEST_CASE("the gradient of dynamic_stitch is each data's rows of dy, checked against finite "
          "differences (catches the gradient sent to the wrong data input or in the wrong order)",
          "[partitioned][dynamic_stitch][gradients]") {
  graph g;
  auto d0 = g.variable("d0", {2, 2}, initializer::zeros(), dtype::float64);
  auto d1 = g.variable("d1", {1, 2}, initializer::zeros(), dtype::float64);
  REQUIRE(d0);
  REQUIRE(d1);
  variable_values vars;
  vars["d0"] = tensor::from_values<double>({2, 2}, {0.5, -1, 2, 0.25});
  vars["d1"] = tensor::from_values<double>({1, 2}, {1.5, -0.75});
  auto merged = dynamic_stitch(g, {g.constant(tensor::from_values<int32_t>({2}, {2, 0})),
                                   g.constant(tensor::from_values<int64_t>({1}, {1}))},
                               {*d0, *d1});
  auto weights = g.constant(tensor::from_values<double>({3, 2}, {1, -2, 0.5, 3, -1, 0.25}));
  auto loss = g.reduce_sum(g.mul(g.square(merged), weights));
  auto grads = gradients(g, loss, {*d0, *d1});
  REQUIRE(grads);
  auto r = run(g, *grads, vars);
  REQUIRE(r);
  const double h = 1e-6;
  for (size_t v = 0; v < 2; ++v) {
    std::string name = v == 0 ? "d0" : "d1";
    for (size_t i = 0; i < vars[name].num_elements(); ++i) {
      INFO(name << " element " << i);
      auto at = [&](double delta) {
        variable_values moved = vars;
        tensor t = moved[name]; // copy on write: vars keeps its value
        t.mutable_data<double>()[i] += delta;
        moved[name] = t;
        auto l = run(g, {loss}, moved);
        REQUIRE(l);
        return l->front().data<double>()[0];
      };
      double numeric = (at(h) - at(-h)) / (2 * h);
      CHECK(std::fabs((*r)[v].data<double>()[i] - numeric) <= 1e-5);
    }
  }
}

TEST_CASE("a seeded random table's shards hold, bit for bit, the one-piece table's rows for mod, "
          "div and contiguous, even and uneven",
          "[partitioned][table_init]") {
  // Catches: every shard drawing the same stream of its seed (each shard a
  // copy of the first rows, the bug this replaces), a shard whose rows are
  // another's (mod's stride, div's offset), a column or row off by one, a
  // normal draw that depends on the element before it.
  for (auto kind : {"uniform", "normal"}) {
    auto init = std::string{kind} == "uniform" ? initializer::uniform(-0.5, 0.5, 42)
                                               : initializer::normal(0.0, 1.0, 42);
    for (auto type : {dtype::float32, dtype::float64}) {
      graph whole_g;
      REQUIRE(whole_g.variable("whole", {13, 5}, table_initializer(init), type));
      variable_values whole_vars;
      REQUIRE(initialize_values(whole_g, whole_vars));
      const tensor& whole = whole_vars.at("whole");
      struct layout_case {
        partition_strategy s;
        size_t n;
        std::vector<int64_t> rows;
      };
      for (const auto& lc : {layout_case{partition_strategy::mod, 5, {}},
                             layout_case{partition_strategy::mod, 1, {}},
                             layout_case{partition_strategy::div, 5, {}},
                             layout_case{partition_strategy::div, 4, {}},
                             layout_case{partition_strategy::contiguous, 3, {1, 10, 2}}}) {
        CAPTURE(kind, dtype_name(type), kernels::to_string(lc.s), lc.n);
        graph g;
        auto t = partitioned_table(g, "emb", {13, 5}, ps_devices(lc.n), lc.s, init, type, lc.rows);
        REQUIRE(t);
        variable_values vars;
        REQUIRE(initialize_values(g, vars));
        auto ids = ids_of_shards(lc.s, t->shard_rows);
        for (size_t k = 0; k < lc.n; ++k) {
          CAPTURE(k);
          const tensor& shard = vars.at(shard_name("emb", k));
          REQUIRE(shard.shape() == shape_type{t->shard_rows[k], 5});
          size_t row_bytes = 5 * dtype_size(type);
          for (size_t r = 0; r < ids[k].size(); ++r) {
            auto* got = reinterpret_cast<const char*>(shard.bytes()) + r * row_bytes;
            auto* want = reinterpret_cast<const char*>(whole.bytes()) + ids[k][r] * row_bytes;
            CHECK(std::memcmp(got, want, row_bytes) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("a table initializer's values spread over their range and differ row by row, and a plain "
          "seeded variable keeps its one stream",
          "[partitioned][table_init]") {
  // Catches: a table generator that repeats rows or columns, or that is not
  // uniform over [low, high); a plain (non-table) variable whose values
  // changed with the table mode (other tests depend on them).
  graph g;
  REQUIRE(g.variable("t", {1000, 64}, table_initializer(initializer::uniform(2, 3, 7))));
  REQUIRE(g.variable("plain", {4}, initializer::uniform(2, 3, 7)));
  variable_values vars;
  REQUIRE(initialize_values(g, vars));
  const float* p = vars.at("t").data<float>();
  double sum = 0;
  std::set<float> distinct;
  for (size_t i = 0; i < 64000; ++i) {
    REQUIRE(p[i] >= 2);
    REQUIRE(p[i] < 3);
    sum += p[i];
    distinct.insert(p[i]);
  }
  CHECK(std::fabs(sum / 64000 - 2.5) < 0.01);
  CHECK(distinct.size() > 63000);
  tensor plain{dtype::float32, {4}};
  REQUIRE(kernels::fill_uniform(plain, 2, 3, 7).ok());
  CHECK(vars.at("plain") == plain);
}

TEST_CASE("a table whose shard initializers name other rows than the shards' is refused naming "
          "the shard",
          "[partitioned][table_init]") {
  // Catches: shards created out of order on a cluster: each would hold
  // another shard's rows, and lookups would read wrong values silently.
  graph g;
  auto sizes = kernels::balanced_shard_rows(7, 2);
  auto init = initializer::uniform(-1, 1, 3);
  auto a = g.variable("emb/part_0", {sizes[0], 2},
                      shard_initializer(init, partition_strategy::mod, sizes, 1));
  auto b = g.variable("emb/part_1", {sizes[1], 2},
                      shard_initializer(init, partition_strategy::mod, sizes, 0));
  REQUIRE(a);
  REQUIRE(b);
  auto t = embedding_table_of(g, "emb", partition_strategy::mod, {*a, *b});
  REQUIRE_FALSE(t);
  CHECK_THAT(t.error().what, Catch::Contains("shard 0 ('emb/part_0')")
                               && Catch::Contains("rows from 1 by 2")
                               && Catch::Contains("rows from 0 by 2"));
  // in order: accepted
  auto c = g.variable("e2/part_0", {sizes[0], 2},
                      shard_initializer(init, partition_strategy::mod, sizes, 0));
  auto d = g.variable("e2/part_1", {sizes[1], 2},
                      shard_initializer(init, partition_strategy::mod, sizes, 1));
  CHECK(embedding_table_of(g, "e2", partition_strategy::mod, {*c, *d}));
}
