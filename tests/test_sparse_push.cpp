// Sparse training at the ps (issue 25, section 3): a table's rows read by id
// (the variable's gather, over CAF and the data plane) and sparse pushes to
// the aggregators (messages/aggregator.hpp's push, sparse), in each mode.
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "caf/all.hpp"

#include "actors/system.hpp"
#include "actors/variable.hpp"
#include "dist/aggregator.hpp"
#include "dist/embedded_cluster.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "scoped_settings.hpp"
#include "value_of.hpp"
#include "wait.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

/// A table's distinct starting values: element k is 0.1 * (k + 1).
tensor ramp(shape_type shape) {
  tensor t{dtype::float32, std::move(shape)};
  auto* p = t.mutable_data<float>();
  for (size_t k = 0; k < t.num_elements(); ++k)
    p[k] = 0.1f * static_cast<float>(k + 1);
  return t;
}

tensor ids64(std::vector<int64_t> v) {
  tensor t{dtype::int64, {static_cast<int64_t>(v.size())}};
  std::memcpy(t.mutable_data<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

tensor ids32(std::vector<int32_t> v) {
  tensor t{dtype::int32, {static_cast<int64_t>(v.size())}};
  std::memcpy(t.mutable_data<int32_t>(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

tensor floats_of(shape_type shape, std::vector<float> v) {
  tensor t{dtype::float32, std::move(shape)};
  REQUIRE(t.num_elements() == v.size());
  std::memcpy(t.mutable_data<float>(), v.data(), v.size() * sizeof(float));
  return t;
}

std::vector<float> floats(const tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.num_elements());
}

/// The value of `cell` now.
tensor value_of_cell(variable_cell& cell) {
  auto v = cell.apply(var_op::read, tensor{}, true);
  REQUIRE(v);
  return v->value;
}

/// An actor system with a dense "w" [2] (ones) and a table "emb" [6, 3]
/// (ramp values), and an aggregator over them whose spec names emb as sparse;
/// requests go out from one scoped actor.
struct sparse_fixture {
  sparse_fixture() : sys(cfg), self(sys) {
    // nop
  }

  ~sparse_fixture() {
    if (agg)
      caf::anon_send_exit(agg, caf::exit_reason::user_shutdown);
  }

  /// Cells emb and w, fresh.
  static std::vector<variable_directory::entry> cells() {
    std::vector<variable_directory::entry> vars;
    auto emb = std::make_shared<variable_cell>(
      variable_spec{"emb", dtype::float32, {6, 3}, "/job:ps/replica:0/task:0/device:CPU:0"});
    REQUIRE(emb->initialize(initializer::from_tensor(ramp({6, 3})), false, "test"));
    auto w = std::make_shared<variable_cell>(variable_spec{"w", dtype::float32, {2}, ""});
    REQUIRE(w->initialize(initializer::ones(), false, "test"));
    // w first: a refused table must leave a dense variable before it unchanged.
    vars.push_back({variable_cell_actor{}, w});
    vars.push_back({variable_cell_actor{}, emb});
    return vars;
  }

  /// The aggregator of `mode` for `workers`, emb sparse unless `dense`.
  caf::expected<aggregator_actor> spawn(const std::string& mode, uint32_t workers,
                                        const std::string& optimizer = "sgd", bool dense = false,
                                        uint32_t replicas = 0, double guard = 0) {
    auto vars = cells();
    w = vars[0].cell;
    emb = vars[1].cell;
    aggregator_spec spec;
    spec.name = "test/" + mode;
    spec.mode = mode;
    spec.variables = {"w", "emb"};
    if (!dense)
      spec.sparse = {"emb"};
    spec.workers = workers;
    spec.optimizer.kind = optimizer;
    spec.optimizer.lr = 0.5;
    spec.replicas_to_aggregate = replicas;
    spec.grad_norm_guard = guard;
    spec.step_timeout_ms = 60000;
    auto a = spawn_aggregator(sys, spec, vars);
    if (a)
      agg = *a;
    return a;
  }

  void join(uint32_t worker) {
    self
      ->request(agg, 10s, join_atom::value, worker, "/job:worker/task:" + std::to_string(worker),
                std::string{"127.0.0.1:1"}, uint32_t{1}, caf::actor{})
      .receive([&](uint64_t, std::string& token, uint64_t) { tokens[worker] = token; },
               [&](caf::error& e) { FAIL(describe(e)); });
  }

  struct answer {
    uint64_t step = 0;
    bool dropped_late = false;
    tensor params;
  };

  /// A sparse push of `worker` at `step`, numbered `seq` (0: the next number).
  caf::expected<answer> push(uint32_t worker, uint64_t step, sparse_push_values v,
                             uint64_t seq = 0) {
    push_credentials who;
    who.token = tokens[worker];
    who.seq = seq == 0 ? ++seqs[worker] : seq;
    caf::expected<answer> out{make_error(af_error::internal, "no reply")};
    self->request(agg, 10s, push_atom::value, sparse_atom::value, worker, step, who, std::move(v))
      .receive([&](uint64_t g, tensor& p, bool late) { out = answer{g, late, p}; },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  aggregator_stats stats() {
    aggregator_stats out;
    self->request(agg, 10s, stats_atom::value)
      .receive([&](aggregator_stats& s) { out = std::move(s); },
               [&](caf::error& e) { FAIL(describe(e)); });
    return out;
  }

  system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  aggregator_actor agg;
  std::shared_ptr<variable_cell> emb, w;
  std::map<uint32_t, std::string> tokens;
  std::map<uint32_t, uint64_t> seqs;
};

sparse_push_values push_of(tensor ids, tensor rows, tensor dense) {
  sparse_push_values v;
  v.ids.push_back(std::move(ids));
  v.rows.push_back(std::move(rows));
  v.dense.push_back(std::move(dense));
  return v;
}

/// Rows of `table` [rows, 3] as floats.
std::vector<float> row(const tensor& table, int64_t r) {
  const float* p = table.data<float>() + r * 3;
  return {p[0], p[1], p[2]};
}

bool same_bits(const tensor& a, const tensor& b, int64_t r) {
  return std::memcmp(a.data<float>() + r * 3, b.data<float>() + r * 3, 3 * sizeof(float)) == 0;
}

} // namespace

// -- reading rows ---------------------------------------------------------------

TEST_CASE("a table's rows are read by id through the variable's cell and its actor, every id "
          "checked first",
          "[sparse_push][gather_rows]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  auto vars = sparse_fixture::cells();
  auto cell = vars[1].cell;
  auto actor = sys.spawn(variable_impl, cell);
  caf::scoped_actor self{sys};
  // Repeats and int32 ids: [n] + shape[1:], in the ids' order.
  for (const auto& ids : {ids64({4, 0, 4}), ids32({4, 0, 4})}) {
    tensor rows;
    uint64_t version = 0;
    self->request(actor, 10s, gather_atom::value, ids)
      .receive([&](tensor& r, uint64_t v) { rows = std::move(r); version = v; },
               [&](caf::error& e) { FAIL(describe(e)); });
    REQUIRE(rows.shape() == shape_type{3, 3});
    auto table = ramp({6, 3});
    CHECK(row(rows, 0) == row(table, 4));
    CHECK(row(rows, 1) == row(table, 0));
    CHECK(row(rows, 2) == row(table, 4));
    CHECK(version == cell->info().version);
  }
  // An id out of range names itself, the table and the node; the table lives on.
  caf::error err;
  self->request(actor, 10s, gather_atom::value, ids64({1, 6}))
    .receive([&](tensor&, uint64_t) { FAIL("a bad id was read"); },
             [&](caf::error& e) { err = std::move(e); });
  REQUIRE(err);
  CHECK(is(err, af_error::invalid_argument));
  CHECK_THAT(describe(err), Catch::Contains("ids[1] = 6 is not in [0, 6)")
                              && Catch::Contains("'emb'") && Catch::Contains("/job:ps"));
  auto again = cell->gather_rows(ids64({5}));
  REQUIRE(again);
  CHECK(row(again->first, 0) == row(ramp({6, 3}), 5));
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

// -- sparse pushes, one actor system ------------------------------------------------

TEST_CASE("an async sparse push changes only the rows it names, values and slots",
          "[sparse_push]") {
  sparse_fixture f;
  REQUIRE(f.spawn("async", 1, "momentum"));
  f.join(0);
  // The first push makes the slots and moves rows 0..3; the second touches 1 and 4.
  auto a = f.push(0, 0,
                  push_of(ids64({0, 1, 2, 3}), floats_of({4, 3}, std::vector<float>(12, 1.0f)),
                          floats_of({2}, {1, 1})));
  REQUIRE(a);
  CHECK(a->step == 1);
  CHECK(a->params.empty()); // no table comes back
  auto before = value_of_cell(*f.emb);
  auto slot_before = *f.emb->slot("momentum");
  auto b = f.push(0, 1,
                  push_of(ids32({4, 1}), floats_of({2, 3}, {1, 2, 3, 4, 5, 6}),
                          floats_of({2}, {0, 0})));
  REQUIRE(b);
  CHECK(b->step == 2);
  auto after = value_of_cell(*f.emb);
  auto slot_after = *f.emb->slot("momentum");
  for (int64_t r : {0, 2, 3, 5}) {
    CHECK(same_bits(before, after, r));
    CHECK(same_bits(slot_before, slot_after, r));
  }
  for (int64_t r : {1, 4}) {
    CHECK_FALSE(same_bits(before, after, r));
    CHECK_FALSE(same_bits(slot_before, slot_after, r));
  }
  // Row 4 had no momentum: accum = g, value -= lr * g.
  auto expect4 = row(ramp({6, 3}), 4);
  CHECK(row(after, 4)[0] == Approx(expect4[0] - 0.5f * 1));
  CHECK(row(after, 4)[2] == Approx(expect4[2] - 0.5f * 3));
}

TEST_CASE("sync with two workers whose ids overlap applies one step equal to the dense step of "
          "their densified gradients",
          "[sparse_push]") {
  // The dense twin: the same variables and values, a dense sync aggregator.
  sparse_fixture dense;
  REQUIRE(dense.spawn("sync", 2, "sgd", true));
  dense.join(0);
  dense.join(1);
  sparse_fixture f;
  REQUIRE(f.spawn("sync", 2, "sgd"));
  f.join(0);
  f.join(1);
  // Worker 0: ids [1 3 3]; worker 1: ids [3 5]. Densified, the table's
  // gradients are each id's rows summed.
  auto r0 = floats_of({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto r1 = floats_of({2, 3}, {-1, 0.5f, 2, 3, 3, 3});
  std::vector<float> g0(18, 0.0f), g1(18, 0.0f);
  auto add_rows = [](std::vector<float>& g, std::vector<int64_t> ids, const tensor& rows) {
    for (size_t i = 0; i < ids.size(); ++i)
      for (int k = 0; k < 3; ++k)
        g[ids[i] * 3 + k] += rows.data<float>()[i * 3 + k];
  };
  add_rows(g0, {1, 3, 3}, r0);
  add_rows(g1, {3, 5}, r1);
  auto w0 = floats_of({2}, {1, -2});
  auto w1 = floats_of({2}, {3, 0.25f});
  // Both workers' pushes go out at once; the round answers both at its release.
  auto s0 = dense.self->request(dense.agg, 10s, push_atom::value, uint32_t{0}, uint64_t{0},
                                push_credentials{dense.tokens[0], 1, ""},
                                std::vector<tensor>{w0, floats_of({6, 3}, g0)});
  auto s1 = dense.self->request(dense.agg, 10s, push_atom::value, uint32_t{1}, uint64_t{0},
                                push_credentials{dense.tokens[1], 1, ""},
                                std::vector<tensor>{w1, floats_of({6, 3}, g1)});
  int answered = 0;
  for (auto* h : {&s0, &s1})
    h->receive([&](uint64_t g, tensor&, bool) { answered += g == 1; },
               [&](caf::error& e) { FAIL(describe(e)); });
  REQUIRE(answered == 2);
  auto p0 = f.self->request(f.agg, 10s, push_atom::value, sparse_atom::value, uint32_t{0},
                            uint64_t{0}, push_credentials{f.tokens[0], 1, ""},
                            push_of(ids64({1, 3, 3}), r0, w0));
  auto p1 = f.self->request(f.agg, 10s, push_atom::value, sparse_atom::value, uint32_t{1},
                            uint64_t{0}, push_credentials{f.tokens[1], 1, ""},
                            push_of(ids32({3, 5}), r1, w1));
  answered = 0;
  for (auto* h : {&p0, &p1})
    h->receive(
      [&](uint64_t g, tensor& params, bool late) {
        answered += g == 1 && params.empty() && !late;
      },
      [&](caf::error& e) { FAIL(describe(e)); });
  REQUIRE(answered == 2);
  auto want = floats(value_of_cell(*dense.emb));
  auto got = floats(value_of_cell(*f.emb));
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k)
    CHECK(std::fabs(got[k] - want[k]) <= 1e-6f);
  CHECK(floats(value_of_cell(*f.w)) == floats(value_of_cell(*dense.w)));
  // Something did move: row 3 got both workers' rows.
  CHECK(got[9] != ramp({6, 3}).data<float>()[9]);
  CHECK(f.stats().applied == 1);
}

TEST_CASE("a late sparse push is dropped, flagged and changes nothing", "[sparse_push]") {
  sparse_fixture f;
  REQUIRE(f.spawn("sync", 2, "sgd", false, 1)); // replicas_to_aggregate 1: a backup worker
  f.join(0);
  f.join(1);
  auto a = f.push(0, 0, push_of(ids64({0}), floats_of({1, 3}, {1, 1, 1}), floats_of({2}, {0, 0})));
  REQUIRE(a);
  CHECK(a->step == 1);
  CHECK_FALSE(a->dropped_late);
  auto before = value_of_cell(*f.emb);
  auto late = f.push(1, 0, push_of(ids64({2}), floats_of({1, 3}, {5, 5, 5}), floats_of({2}, {1, 1})));
  REQUIRE(late);
  CHECK(late->dropped_late);
  CHECK(late->step == 1);
  CHECK(late->params.empty());
  CHECK(floats(value_of_cell(*f.emb)) == floats(before));
  auto s = f.stats();
  CHECK(s.dropped_stale == 1);
  CHECK(s.workers.at(1).late == 1);
}

TEST_CASE("a retried sparse push is answered and counted once", "[sparse_push]") {
  sparse_fixture f;
  REQUIRE(f.spawn("async", 1));
  f.join(0);
  auto v = push_of(ids64({2, 2}), floats_of({2, 3}, {1, 1, 1, 1, 1, 1}), floats_of({2}, {1, 1}));
  auto a = f.push(0, 0, v, 1);
  REQUIRE(a);
  auto once = floats(value_of_cell(*f.emb));
  auto b = f.push(0, 0, v, 1); // the same number: a retry whose answer was lost
  REQUIRE(b);
  CHECK(b->step == 1);
  CHECK(floats(value_of_cell(*f.emb)) == once);
  // Repeated ids add up: row 2 moved by lr * 2.
  CHECK(once[6] == Approx(ramp({6, 3}).data<float>()[6] - 0.5f * 2));
  auto s = f.stats();
  CHECK(s.applied == 1);
  CHECK(s.global_step == 1);
}

TEST_CASE("a sparse push with an id out of range is refused naming it, and the table keeps "
          "working",
          "[sparse_push]") {
  for (auto mode : {"async", "ssp", "sync"}) {
    DYNAMIC_SECTION(mode) {
      sparse_fixture f;
      REQUIRE(f.spawn(mode, 1));
      f.join(0);
      auto before_emb = floats(value_of_cell(*f.emb));
      auto before_w = floats(value_of_cell(*f.w));
      auto bad = f.push(0, 0, push_of(ids64({1, 9}), floats_of({2, 3}, std::vector<float>(6, 1)),
                                      floats_of({2}, {1, 1})));
      REQUIRE_FALSE(bad);
      CHECK(is(bad.error(), af_error::invalid_argument));
      CHECK_THAT(describe(bad.error()), Catch::Contains("indices[1] = 9 is not in [0, 6)")
                                          && Catch::Contains("'emb'")
                                          && Catch::Contains("/job:ps"));
      // No variable changed, the dense one included.
      CHECK(floats(value_of_cell(*f.emb)) == before_emb);
      CHECK(floats(value_of_cell(*f.w)) == before_w);
      auto good = f.push(0, 0, push_of(ids64({1}), floats_of({1, 3}, {1, 1, 1}),
                                       floats_of({2}, {1, 1})));
      REQUIRE(good);
      CHECK(good->step == 1);
      CHECK(floats(value_of_cell(*f.emb)) != before_emb);
    }
  }
}

TEST_CASE("a sparse push with a non-finite row is refused and counted, and the norm guard "
          "scales rows",
          "[sparse_push]") {
  sparse_fixture f;
  REQUIRE(f.spawn("async", 1, "sgd", false, 0, 2));
  f.join(0);
  auto before = floats(value_of_cell(*f.emb));
  auto nan = f.push(0, 0, push_of(ids64({2}), floats_of({1, 3}, {1, std::nanf(""), 1}),
                                  floats_of({2}, {0, 0})));
  REQUIRE_FALSE(nan);
  CHECK(is(nan.error(), af_error::non_finite));
  CHECK_THAT(describe(nan.error()), Catch::Contains("'emb'") && Catch::Contains("element 1"));
  CHECK(floats(value_of_cell(*f.emb)) == before);
  CHECK(f.stats().refused == 1);
  // Eight ordinary pushes of norm 1 (the guard's warm-up), then one of norm
  // 100: scaled down to 2 x the median, so row 5 moves by lr * 2 in all.
  for (uint64_t step = 0; step < 8; ++step)
    REQUIRE(f.push(0, step, push_of(ids64({0}), floats_of({1, 3}, {1, 0, 0}),
                                    floats_of({2}, {0, 0}))));
  auto big = f.push(0, 8, push_of(ids64({5}), floats_of({1, 3}, {100, 0, 0}),
                                  floats_of({2}, {0, 0})));
  REQUIRE(big);
  auto after = floats(value_of_cell(*f.emb));
  CHECK(after[15] == Approx(before[15] - 0.5f * 2));
  CHECK(f.stats().workers.at(0).guarded == 1);
}

TEST_CASE("an aggregator takes only the push form of its spec", "[sparse_push]") {
  sparse_fixture f;
  REQUIRE(f.spawn("async", 1));
  f.join(0);
  caf::error err;
  f.self
    ->request(f.agg, 10s, push_atom::value, uint32_t{0}, uint64_t{0},
              push_credentials{f.tokens[0], 1, ""},
              std::vector<tensor>{tensor::filled(dtype::float32, {2}, 1),
                                  tensor::filled(dtype::float32, {6, 3}, 1)})
    .receive([&](uint64_t, tensor&, bool) { FAIL("a dense push of a table was taken"); },
             [&](caf::error& e) { err = std::move(e); });
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("sparse") && Catch::Contains("emb"));
  sparse_fixture d;
  REQUIRE(d.spawn("async", 1, "sgd", true));
  d.join(0);
  auto r = d.push(0, 0, push_of(ids64({1}), floats_of({1, 3}, {1, 1, 1}), floats_of({2}, {1, 1})));
  REQUIRE_FALSE(r);
  CHECK_THAT(describe(r.error()), Catch::Contains("no tables"));
}

TEST_CASE("worker index 2^32 - 1 over CAF is refused by every handler, and the aggregator grows "
          "nothing for it", "[sparse_push]") {
  // The data plane's frame carries a worker index in 16 bits; a CAF message
  // carries 32. A handler that sized its members by the index before the
  // bound (member() resizes to index + 1) would make a ps allocate 2^32
  // members for one message of a stranger.
  sparse_fixture f;
  REQUIRE(f.spawn("sync", 2));
  f.join(0);
  f.join(1);
  const uint32_t huge = std::numeric_limits<uint32_t>::max();
  std::vector<std::string> refusals;
  auto refused = [&](caf::error& e) { refusals.push_back(describe(e)); };
  f.self
    ->request(f.agg, 10s, join_atom::value, huge, std::string{"/job:worker/task:9"},
              std::string{"127.0.0.1:1"}, uint32_t{1}, caf::actor{})
    .receive([&](uint64_t, std::string&, uint64_t) { FAIL("a join of index 2^32 - 1 was taken"); },
             refused);
  f.self
    ->request(f.agg, 10s, push_atom::value, sparse_atom::value, huge, uint64_t{0},
              push_credentials{f.tokens[0], 1, ""},
              push_of(ids64({1}), floats_of({1, 3}, {1, 1, 1}), floats_of({2}, {1, 1})))
    .receive([&](uint64_t, tensor&, bool) { FAIL("a push of index 2^32 - 1 was taken"); }, refused);
  f.self->request(f.agg, 10s, closed_atom::value, huge, uint64_t{0}, f.tokens[0])
    .receive([&](uint64_t, bool) { FAIL("a closed query of index 2^32 - 1 was answered"); }, refused);
  f.self->request(f.agg, 10s, done_atom::value, huge, f.tokens[0], std::string{})
    .receive([&](uint32_t) { FAIL("a done of index 2^32 - 1 was taken"); }, refused);
  REQUIRE(refusals.size() == 4);
  for (const auto& r : refusals)
    CHECK_THAT(r, Catch::Contains("4294967295"));
  // Nothing was made for it: two members, both still pushing, and a round
  // of theirs closes.
  CHECK(f.stats().workers.size() == 2);
  auto p0 = f.self->request(f.agg, 10s, push_atom::value, sparse_atom::value, uint32_t{0},
                            uint64_t{0}, push_credentials{f.tokens[0], 1, ""},
                            push_of(ids64({1}), floats_of({1, 3}, {1, 1, 1}), floats_of({2}, {1, 1})));
  auto p1 = f.self->request(f.agg, 10s, push_atom::value, sparse_atom::value, uint32_t{1},
                            uint64_t{0}, push_credentials{f.tokens[1], 1, ""},
                            push_of(ids64({2}), floats_of({1, 3}, {1, 1, 1}), floats_of({2}, {1, 1})));
  for (auto* p : {&p0, &p1})
    p->receive([&](uint64_t g, tensor&, bool late) { CHECK(g == 1); CHECK_FALSE(late); },
               [&](caf::error& e) { FAIL(describe(e)); });
}

TEST_CASE("an aggregator with tables refuses a pull, which would copy its tables whole",
          "[sparse_push]") {
  sparse_fixture f;
  REQUIRE(f.spawn("async", 1));
  caf::error err;
  f.self->request(f.agg, 10s, pull_atom::value)
    .receive([&](uint64_t, tensor&) { FAIL("a pull copied the tables whole"); },
             [&](caf::error& e) { err = std::move(e); });
  REQUIRE(err);
  CHECK(is(err, af_error::invalid_argument));
  CHECK_THAT(describe(err), Catch::Contains("[emb]") && Catch::Contains("gather_rows"));
  sparse_fixture d;
  REQUIRE(d.spawn("async", 1, "sgd", true));
  d.self->request(d.agg, 10s, pull_atom::value)
    .receive([&](uint64_t, tensor& p) { CHECK(p.num_elements() == 2 + 6 * 3); },
             [&](caf::error& e) { FAIL(describe(e)); });
}

TEST_CASE("average refuses sparse tables when the aggregator is spawned, and so does a switch "
          "into it",
          "[sparse_push]") {
  sparse_fixture f;
  auto a = f.spawn("average", 2);
  REQUIRE_FALSE(a);
  CHECK(is(a.error(), af_error::invalid_argument));
  CHECK_THAT(describe(a.error()), Catch::Contains("average mode cannot take sparse gradients")
                                    && Catch::Contains("sync, async or ssp"));
  REQUIRE(f.spawn("async", 1));
  aggregator_spec want;
  want.mode = "average";
  want.variables = {"w", "emb"};
  caf::error err;
  f.self->request(f.agg, 10s, switch_atom::value, want)
    .receive([&](uint64_t) { FAIL("switched into average"); },
             [&](caf::error& e) { err = std::move(e); });
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("cannot switch to average"));
}

// -- over the data plane --------------------------------------------------------------

namespace {

/// A small job on one ps of an embedded cluster: a 6 x 3 table "emb" (the
/// ramp) and "w" (ones), initialized, and an async aggregator `name` of
/// them (emb sparse, SGD at 0.5; `workers` of them, 0: the spec's own).
struct small_plane_job {
  std::unique_ptr<embedded_cluster> cluster;
  std::optional<session> s; ///< a worker's, on the cluster (ended before it)
  aggregator_spec spec;
  aggregator_actor agg;
};

small_plane_job start_small_plane_job(const std::string& name, uint32_t workers = 0,
                                      const std::string& mode = "async",
                                      uint32_t step_timeout_ms = 30000) {
  small_plane_job j;
  auto c = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(c);
  j.cluster = std::move(*c);
  auto s = j.cluster->session_for("worker", 0);
  REQUIRE(s);
  j.s.emplace(std::move(*s));
  {
    auto scope = j.s->device("/job:ps/task:0");
    REQUIRE(j.s->variable("emb", {6, 3}, initializer::from_tensor(ramp({6, 3}))));
    REQUIRE(j.s->variable("w", {2}, initializer::ones()));
  }
  REQUIRE_FALSE(j.s->initialize());
  j.spec.name = name;
  j.spec.mode = mode;
  j.spec.step_timeout_ms = step_timeout_ms;
  j.spec.variables = {"emb", "w"};
  j.spec.sparse = {"emb"};
  j.spec.optimizer.kind = "sgd";
  j.spec.optimizer.lr = 0.5;
  if (workers > 0)
    j.spec.workers = workers;
  auto agg = j.s->aggregator("ps", 0, j.spec);
  REQUIRE(agg);
  j.agg = *agg;
  return j;
}

/// Joins worker `index` to `agg`: its token.
std::string join_worker(caf::actor_system& sys, const aggregator_actor& agg, uint32_t index) {
  caf::scoped_actor self{sys};
  std::string token;
  self
    ->request(agg, 10s, join_atom::value, index, "/job:worker/task:" + std::to_string(index),
              std::string{"127.0.0.1:1"}, uint32_t{1}, caf::actor{})
    .receive([&](uint64_t, std::string& t, uint64_t) { token = t; },
             [&](caf::error& e) { FAIL(describe(e)); });
  return token;
}

} // namespace

// Bug caught: a worker with sparse pushes out to several ps read their
// answers in the ps' order, so the chief sat in one ps's sync round while
// another ps had died and the round waited for a worker that waited for
// the chief to restore that ps (the job failed at step_timeout_ms). The
// look it reads them by must say "not yet" while a round is open, and "in"
// once it closed, or ended as its node stops, on TCP and on shared memory
// (whose answer comes through the ring, not the socket).
TEST_CASE("a channel says when its oldest answer is in without reading it: a round that closes "
          "and one that ends as its node stops",
          "[sparse_push][data_plane]") {
  const bool shm = GENERATE(false, true);
  // A round that waits in vain ends in 2 s (the node's stop waits for it).
  auto job = start_small_plane_job("test/sparse_await", 2, "sync", 2000);
  auto& sys = job.s->system();
  auto t0 = join_worker(sys, job.agg, 0);
  auto t1 = join_worker(sys, job.agg, 1);
  auto port = testing::value_of(job.s->ping("ps", 0)).data_port;
  auto open = [&] {
    auto ch = testing::value_of(
      data_channel::connect("127.0.0.1", port, "/job:ps/task:0", 5s, {}, nullptr, nullptr, shm));
    REQUIRE(ch->gather_rows("emb", ids64({0}))); // the first answer: a move to shm after it
    REQUIRE(ch->gather_rows("emb", ids64({0})));
    return ch;
  };
  auto c0 = open();
  auto c1 = open();
  INFO(c0->transport());
  CHECK((c0->transport() == "shared memory") == shm);
  auto push = [&](data_channel& c, uint32_t worker, uint64_t step, const std::string& token,
                  uint64_t seq) {
    return c.send_push_sparse(job.spec.name, worker, step, {floats_of({2}, {1, 1})},
                              {ids64({1})}, {floats_of({1, 3}, {1, 1, 1})}, 10s, token, seq);
  };
  REQUIRE_FALSE(push(*c0, 0, 0, t0, 1));
  // The round waits for worker 1: nothing to read yet.
  CHECK_FALSE(c0->await_reply(std::chrono::steady_clock::now() + 100ms));
  REQUIRE_FALSE(push(*c1, 1, 0, t1, 1));
  CHECK(c1->await_reply(std::chrono::steady_clock::now() + 10s));
  CHECK(testing::value_of(c1->next_reply()).version == 1);
  CHECK(c0->await_reply(std::chrono::steady_clock::now() + 10s));
  CHECK(testing::value_of(c0->next_reply()).version == 1);
  // The next round waits for worker 1 again; the node stops meanwhile (it
  // answers the round's end, or closes the connection).
  REQUIRE_FALSE(push(*c0, 0, 1, t0, 2));
  CHECK_FALSE(c0->await_reply(std::chrono::steady_clock::now() + 100ms));
  job.s.reset();
  REQUIRE_FALSE(job.cluster->shutdown(20s));
  CHECK(c0->await_reply(std::chrono::steady_clock::now() + 10s));
  CHECK_FALSE(c0->next_reply());
}

namespace {

/// A ps in a process of its own holding the table `emb` [6, 3] and `w`
/// [2], a session on it, and a data channel to it, on `transport` (after
/// its first answer): "tcp", "shared memory" or "ucx" (forced on this host,
/// the fabric trusted by both ends; only where the build has UCX).
struct ps_process {
  explicit ps_process(const std::string& transport)
    : ucx(transport == "ucx"),
      force("ACTORFLOW_DATA_UCX", ucx ? "force" : "off"), shm_on("ACTORFLOW_DATA_SHM", nullptr),
      hook_trust(wire_test_hooks()->trusted_fabric || ucx), trust(process_trusted_fabric() || ucx),
      pc(testing::value_of(testing::process_cluster::start({{"ps", 1}, {"worker", 1}}, opts))),
      c(opts), s(testing::value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0"))) {
    {
      auto scope = s.device("/job:ps/task:0");
      REQUIRE(s.variable("emb", {6, 3}, initializer::from_tensor(ramp({6, 3}))));
      REQUIRE(s.variable("w", {2}, initializer::ones()));
    }
    REQUIRE_FALSE(s.initialize());
    auto port = testing::value_of(s.ping("ps", 0)).data_port;
    ch = testing::value_of(data_channel::connect("127.0.0.1", port, "/job:ps/task:0", 1s, {},
                                                 nullptr, nullptr, transport == "shared memory",
                                                 ucx));
    REQUIRE(ch->gather_rows("emb", ids64({0}))); // the first answer: a move after it
    REQUIRE(ch->gather_rows("emb", ids64({0})));
    INFO(ch->transport());
    if (ucx)
      CHECK(ch->transport().rfind("ucx", 0) == 0);
    else
      CHECK(ch->transport() == transport);
  }

  /// The transports a test runs on: TCP, shared memory, and UCX where built.
  static std::string any() {
#ifdef ACTORFLOW_WITH_UCX
    return GENERATE(as<std::string>{}, "tcp", "shared memory", "ucx");
#else
    return GENERATE(as<std::string>{}, "tcp", "shared memory");
#endif
  }

  bool ucx;
  testing::scoped_env force;  ///< ACTORFLOW_DATA_UCX: the transport asked for, whatever the run's
  testing::scoped_env shm_on; ///< ACTORFLOW_DATA_SHM unset
  testing::scoped_hook_trust hook_trust;
  testing::scoped_trust trust;
  node_options opts;
  std::unique_ptr<testing::process_cluster> pc;
  testing::cluster_client c;
  session s;
  std::unique_ptr<data_channel> ch;
};

} // namespace

// Bug caught: a worker waiting on answers of several ps that all went
// silent with their connections open (stopped, or their hosts cut off)
// looked and waited for ever: the look ignored the request's own deadline,
// past which next_reply() fails (as a lone read did before).
TEST_CASE("a look at a stopped node's answer says it is in at the request's deadline, on TCP, "
          "on shared memory and over UCX",
          "[sparse_push][data_plane][processes]") {
  ps_process ps{ps_process::any()};
  auto& ch = ps.ch;
  REQUIRE(ps.pc->signal("ps", 0, SIGSTOP));
  REQUIRE_FALSE(ch->send_read("w", 1ms)); // its deadline passes while the node is stopped
  CHECK(ch->await_reply(std::chrono::steady_clock::now() + 60s));
  auto r = ch->next_reply();
  REQUIRE_FALSE(r);
  INFO(describe(r.error()));
  CHECK(is(r.error(), af_error::timeout));
  REQUIRE(ps.pc->signal("ps", 0, SIGCONT));
}

// Bugs caught: on shared memory, a look that does not wait (a worker with
// pushes out to several ps looks at each between its waits) never saw the
// end of a ps that had died: its wait sees the socket only while it sleeps
// on it. The chief then never read the dead ps first (the flake above).
// Over UCX every look said "in" (the chief then read its answers in the ps'
// order, and waited in the live ps's round); a look that waits must sleep
// until its bound while the round is open, and wake at the node's end.
TEST_CASE("a look that does not wait, and one that waits, see a killed node's end with a push "
          "out, on TCP, on shared memory and over UCX",
          "[sparse_push][data_plane][processes]") {
  ps_process ps{ps_process::any()};
  const bool waits = GENERATE(false, true);
  INFO((waits ? "a look that waits" : "looks that do not wait"));
  auto& ch = ps.ch;
  aggregator_spec spec;
  spec.name = "test/sparse_killed";
  spec.mode = "sync";
  spec.workers = 2;
  spec.variables = {"emb", "w"};
  spec.sparse = {"emb"};
  spec.optimizer.kind = "sgd";
  auto agg = testing::value_of(ps.s.aggregator("ps", 0, spec));
  auto token = join_worker(ps.s.system(), agg, 0);
  REQUIRE_FALSE(ch->send_push_sparse(spec.name, 0, 0, {floats_of({2}, {1, 1})}, {ids64({1})},
                                     {floats_of({1, 3}, {1, 1, 1})}, 30s, token, 1));
  // The round waits for worker 1: not in, now or by the bound.
  CHECK_FALSE(ch->await_reply(std::chrono::steady_clock::now()));
  CHECK_FALSE(ch->await_reply(std::chrono::steady_clock::now() + 100ms));
  if (waits) {
    // Killed while the look sleeps; it wakes before its bound (and the
    // request's deadline, 30 s): false if it slept through the end.
    blocking_call<bool> look{
      [&] { return ch->await_reply(std::chrono::steady_clock::now() + 10s); }};
    REQUIRE(look.asleep(10s));
    REQUIRE(ps.pc->signal("ps", 0, SIGKILL));
    CHECK(look.join());
  } else {
    REQUIRE(ps.pc->signal("ps", 0, SIGKILL)); // reaped: its sockets are closed
    // Until the end shows (loopback delivers it at once, a loaded machine a
    // moment later): bounded.
    CHECK(eventually([&] { return ch->await_reply(std::chrono::steady_clock::now()); }, 5s));
  }
  CHECK_FALSE(ch->next_reply());
}

TEST_CASE("rows are read and sparse pushes applied over the data plane", "[sparse_push][data_plane]") {
  auto job = start_small_plane_job("test/sparse_plane");
  {
    auto& s = job.s;
    const auto& spec = job.spec;
    auto* agg = &job.agg;
    caf::scoped_actor self{s->system()};
    std::string token;
    self
      ->request(*agg, 10s, join_atom::value, uint32_t{0}, std::string{"/job:worker/task:0"},
                std::string{"127.0.0.1:1"}, uint32_t{1}, caf::actor{})
      .receive([&](uint64_t, std::string& t, uint64_t) { token = t; },
               [&](caf::error& e) { FAIL(describe(e)); });
    auto info = s->ping("ps", 0);
    REQUIRE(info);
    REQUIRE(info->data_port != 0);
    auto ch = data_channel::connect("127.0.0.1", info->data_port, "/job:ps/task:0", 5s);
    REQUIRE(ch);
    auto& c = **ch;
    // Rows by id: only those come back.
    auto got = c.gather_rows("emb", ids32({5, 1}));
    REQUIRE(got);
    CHECK(got->first.shape() == shape_type{2, 3});
    CHECK(row(got->first, 0) == row(ramp({6, 3}), 5));
    // A sparse push: the dense floats flat, the table's ids (int32 widened) and rows.
    bool late = true;
    auto step = c.push_sparse(spec.name, 0, 0, {floats_of({2}, {2, 2})}, {ids32({1, 1})},
                              {floats_of({2, 3}, {1, 1, 1, 1, 1, 1})}, 10s, token, 1, &late);
    REQUIRE(step);
    CHECK(*step == 1);
    CHECK_FALSE(late);
    auto after = c.gather_rows("emb", ids64({1, 0}));
    REQUIRE(after);
    CHECK(row(after->first, 0)[0] == Approx(row(ramp({6, 3}), 1)[0] - 0.5f * 2));
    CHECK(row(after->first, 1) == row(ramp({6, 3}), 0));
    auto w = c.call(var_op::read, "w", nullptr, true);
    REQUIRE(w);
    CHECK(floats(w->first) == std::vector<float>{0, 0});
    // A bad id, read or pushed: refused naming it, and the ps lives on.
    auto bad = c.gather_rows("emb", ids64({0, 7}));
    REQUIRE_FALSE(bad);
    CHECK(is(bad.error(), af_error::invalid_argument));
    CHECK_THAT(describe(bad.error()), Catch::Contains("ids[1] = 7") && Catch::Contains("'emb'")
                                        && Catch::Contains("/job:ps/replica:0/task:0"));
    auto bad_push = c.push_sparse(spec.name, 0, 1, {floats_of({2}, {0, 0})}, {ids64({6})},
                                  {floats_of({1, 3}, {1, 1, 1})}, 10s, token, 2);
    REQUIRE_FALSE(bad_push);
    CHECK_THAT(describe(bad_push.error()), Catch::Contains("indices[0] = 6 is not in [0, 6)"));
    // More rows than the table has (a stranger's way to make the node
    // allocate up to max_message_bytes): refused before the rows are read.
    std::vector<int64_t> many(7, 1);
    auto too_many = c.push_sparse(spec.name, 0, 1, {floats_of({2}, {0, 0})},
                                  {ids64(many)}, {floats_of({7, 3}, std::vector<float>(21, 1))},
                                  10s, token, 2);
    REQUIRE_FALSE(too_many);
    CHECK_THAT(describe(too_many.error()), Catch::Contains("7 rows of its table 0, which has 6"));
    CHECK_FALSE(c.broken());
    // A payload whose counts do not match its size: refused, the connection goes on.
    auto short_rows = c.push_sparse(spec.name, 0, 1, {floats_of({2}, {0, 0})}, {ids64({1, 2})},
                                    {floats_of({2, 2}, {1, 1, 1, 1})}, 10s, token, 3);
    REQUIRE_FALSE(short_rows);
    CHECK(is(short_rows.error(), af_error::shape_mismatch));
    CHECK_FALSE(c.broken());
    auto still = c.gather_rows("emb", ids64({1}));
    REQUIRE(still);
    CHECK(row(still->first, 0) == row(after->first, 0));
    // An abstention: no payload, counted as refused, the step stays.
    auto abstain = c.push_sparse(spec.name, 0, 1, {}, {}, {}, 10s, token, 4);
    REQUIRE(abstain);
    CHECK(*abstain == 1);
    // A pull (no token needed) would copy the tables whole: refused, naming
    // them; a dense push is told to send push_sparse, not "float32[N]".
    auto pulled = c.aggregate(wire::kind::pull, spec.name, 0, 0, {}, 10s);
    REQUIRE_FALSE(pulled);
    CHECK_THAT(describe(pulled.error()), Catch::Contains("[emb]") && Catch::Contains("gather_rows"));
    auto dense = c.aggregate(wire::kind::push, spec.name, 0, 1,
                             {tensor::filled(dtype::float32, {6 * 3 + 2}, 0)}, 10s, token, 5);
    REQUIRE_FALSE(dense);
    CHECK_THAT(describe(dense.error()), Catch::Contains("push_sparse"));
    CHECK_FALSE(c.broken());
  }
}

TEST_CASE("a push with the token its index had before it was joined again is refused saying "
          "so", "[sparse_push][data_plane]") {
  // A worker stopped past connection_timeout_ms is taken as left; another
  // process with its --task may then join the index. When the first one is
  // continued, its push was refused as a stranger's ("it does not carry the
  // token that worker joined with"), which did not say what happened.
  auto job = start_small_plane_job("test/sparse_rejoined", 1);
  auto& s = job.s;
  const auto& spec = job.spec;
  auto* agg = &job.agg;
  caf::scoped_actor self{s->system()};
  auto join = [&] {
    std::string token;
    self
      ->request(*agg, 10s, join_atom::value, uint32_t{0}, std::string{"/job:worker/task:0"},
                std::string{"127.0.0.1:1"}, uint32_t{1}, caf::actor{})
      .receive([&](uint64_t, std::string& t, uint64_t) { token = t; },
               [&](caf::error& e) { FAIL(describe(e)); });
    return token;
  };
  auto first = join();
  // The first process's index is given up (here by its done; in the field by
  // its link's timeout), and another join takes it.
  self->request(*agg, 10s, done_atom::value, uint32_t{0}, first, std::string{})
    .receive([](uint32_t) {}, [&](caf::error& e) { FAIL(describe(e)); });
  auto second = join();
  REQUIRE(second != first);
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  auto ch = data_channel::connect("127.0.0.1", info->data_port, "/job:ps/task:0", 5s);
  REQUIRE(ch);
  auto push = [&](const std::string& token, uint64_t seq) {
    return (*ch)->push_sparse(spec.name, 0, 0, {floats_of({2}, {1, 1})}, {ids64({1})},
                              {floats_of({1, 3}, {1, 1, 1})}, 10s, token, seq);
  };
  auto old = push(first, 1);
  REQUIRE_FALSE(old);
  CHECK(is(old.error(), af_error::invalid_argument));
  CHECK_THAT(describe(old.error()), Catch::Contains("before its index was joined again")
                                      && Catch::Contains("one process runs per --task"));
  std::string stranger(first.size(), 'x');
  auto forged = push(stranger, 1);
  REQUIRE_FALSE(forged);
  CHECK_THAT(describe(forged.error()), Catch::Contains("does not carry the token"));
  auto now = push(second, 1);
  REQUIRE(now);
}

// -- pushes taken on the data plane's thread ------------------------------------
//
// The common sparse push is applied on the data-plane thread that read it,
// under the aggregator's lock (dist/aggregator_plane.cpp), while the actor
// goes on serving joins, saves, switches and the other pushes: each of
// these races one against the other.

namespace {

/// An embedded cluster of one ps (and one worker node for the session)
/// holding "emb" [rows, dim] and "w" [dim], both zeros, and an aggregator of
/// `mode` over them (emb sparse, sgd at lr 0.5) for `workers` workers, each
/// joined (tokens[w]); `ch` is a data-plane connection to the ps.
struct plane_fixture {
  plane_fixture(const std::string& mode, uint32_t workers, int64_t rows, int64_t dim)
    : rows(rows), dim(dim) {
    auto c = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
    REQUIRE(c);
    cluster = std::move(*c);
    auto s = cluster->session_for("worker", 0);
    REQUIRE(s);
    sess = std::make_unique<session>(std::move(*s));
    {
      auto scope = sess->device("/job:ps/task:0");
      REQUIRE(sess->variable("emb", {rows, dim}, initializer::zeros()));
      REQUIRE(sess->variable("w", {dim}, initializer::zeros()));
    }
    REQUIRE_FALSE(sess->initialize());
    spec.name = "test/plane_" + mode;
    spec.mode = mode;
    spec.variables = {"emb", "w"};
    spec.sparse = {"emb"};
    spec.workers = workers;
    spec.optimizer.kind = "sgd";
    spec.optimizer.lr = 0.5;
    spec.step_timeout_ms = 60000;
    auto a = sess->aggregator("ps", 0, spec);
    REQUIRE(a);
    agg = *a;
    self = std::make_unique<caf::scoped_actor>(sess->system());
    for (uint32_t w = 0; w < workers; ++w)
      join(w);
    auto info = sess->ping("ps", 0);
    REQUIRE(info);
    auto ch = data_channel::connect("127.0.0.1", info->data_port, "/job:ps/task:0", 5s);
    REQUIRE(ch);
    plane = std::move(*ch);
  }

  void join(uint32_t worker) {
    (*self)
      ->request(agg, 10s, join_atom::value, worker, "/job:worker/task:" + std::to_string(worker),
                std::string{"127.0.0.1:1"}, uint32_t{1}, caf::actor{})
      .receive([&](uint64_t, std::string& token, uint64_t) { tokens[worker] = token; },
               [&](caf::error& e) { FAIL(describe(e)); });
  }

  /// Every row of emb, and w, with gradient `g`.
  std::vector<int64_t> all_ids() const {
    std::vector<int64_t> v(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      v[static_cast<size_t>(r)] = r;
    return v;
  }
  tensor all_rows(float g) const {
    return tensor::filled(dtype::float32, {rows, dim}, g);
  }

  /// A push of every row over the data plane (this fixture's connection).
  caf::expected<uint64_t> push_plane(data_channel& c, uint32_t worker, uint64_t step,
                                     uint64_t seq, float g) {
    return c.push_sparse(spec.name, worker, step, {tensor::filled(dtype::float32, {dim}, g)},
                         {ids64(all_ids())}, {all_rows(g)}, 30s, tokens[worker], seq);
  }

  /// The same push through the actor (CAF), from `from`.
  caf::expected<uint64_t> push_caf(caf::scoped_actor& from, uint32_t worker, uint64_t step,
                                   uint64_t seq, float g) {
    push_credentials who;
    who.token = tokens[worker];
    who.seq = seq;
    sparse_push_values v;
    v.dense.push_back(tensor::filled(dtype::float32, {dim}, g));
    v.ids.push_back(ids64(all_ids()));
    v.rows.push_back(all_rows(g));
    caf::expected<uint64_t> out{make_error(af_error::internal, "no reply")};
    from->request(agg, 30s, push_atom::value, sparse_atom::value, worker, step, who, std::move(v))
      .receive([&](uint64_t g2, tensor&, bool) { out = g2; },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  aggregator_stats stats() {
    aggregator_stats out;
    (*self)
      ->request(agg, 10s, stats_atom::value)
      .receive([&](aggregator_stats& s) { out = std::move(s); },
               [&](caf::error& e) { FAIL(describe(e)); });
    return out;
  }

  int64_t rows, dim;
  std::unique_ptr<embedded_cluster> cluster;
  std::unique_ptr<session> sess;
  aggregator_spec spec;
  aggregator_actor agg;
  std::unique_ptr<caf::scoped_actor> self;
  std::map<uint32_t, std::string> tokens;
  std::unique_ptr<data_channel> plane;
};

} // namespace

TEST_CASE("a save taken while async sparse pushes are applied on the data plane holds one "
          "global step, every variable at it",
          "[sparse_push][data_plane]") {
  // Each push moves every element of emb and w by -0.5 * 2^-9 = -2^-10
  // (exact in float): a state at global step k holds -k * 2^-10 everywhere.
  // A save that read the step while a push was between its variables, or
  // between its update and its count, would hold another value.
  plane_fixture f("async", 1, 4096, 32);
  const float g = 1.0f / 512;
  constexpr uint64_t pushes = 400;
  std::atomic<bool> stop{false}, failed{false};
  std::string failure; // written before `failed` is set, read after the join
  std::thread pusher([&] {
    for (uint64_t k = 1; k <= pushes && !stop; ++k) {
      auto r = f.push_plane(*f.plane, 0, k - 1, k, g);
      if (!r) {
        failure = describe(r.error());
        failed = true;
        return;
      }
    }
  });
  uint64_t saves = 0, inconsistent = 0, step_seen = 0;
  while (step_seen < pushes && !failed) {
    aggregator_state saved;
    (*f.self)
      ->request(f.agg, 10s, save_atom::value)
      .receive([&](aggregator_state& s) { saved = std::move(s); },
               [&](caf::error& e) { FAIL(describe(e)); });
    ++saves;
    step_seen = saved.global_step;
    const float want = -static_cast<float>(saved.global_step) / 1024;
    for (const auto& v : saved.values) {
      const float* p = v.data<float>();
      for (size_t k = 0; k < v.num_elements(); ++k)
        if (p[k] != want) {
          ++inconsistent;
          break;
        }
    }
  }
  stop = true;
  pusher.join();
  REQUIRE(failure.empty());
  INFO(saves << " saves");
  CHECK(inconsistent == 0);
  auto s = f.stats();
  CHECK(s.global_step == pushes);
  CHECK(s.applied == pushes);
}

TEST_CASE("async sparse pushes on the data plane and through the actor, with joins meanwhile, "
          "are each applied once",
          "[sparse_push][data_plane]") {
  // Worker 0 pushes over the data plane (the plane's path), worker 1 through
  // the actor, while new workers join (each join grows the members the
  // plane's path reads): no push is lost or counted twice.
  plane_fixture f("async", 2, 512, 16);
  const float g = 1.0f / 512;
  constexpr uint64_t pushes = 300;
  std::string failure;
  std::thread pusher([&] {
    for (uint64_t k = 1; k <= pushes; ++k)
      if (auto r = f.push_plane(*f.plane, 0, 0, k, g); !r) {
        failure = describe(r.error());
        return;
      }
  });
  caf::scoped_actor other{f.sess->system()};
  for (uint64_t k = 1; k <= pushes; ++k) {
    auto r = f.push_caf(other, 1, 0, k, g);
    REQUIRE(r);
    if (k % 10 == 0)
      f.join(static_cast<uint32_t>(1 + k / 10)); // workers 2..31 join
  }
  pusher.join();
  REQUIRE(failure.empty());
  auto s = f.stats();
  CHECK(s.global_step == 2 * pushes);
  CHECK(s.applied == 2 * pushes);
  CHECK(s.pushes == 2 * pushes);
  CHECK(s.pushes_on_plane == pushes); // worker 0's, every one on the plane's path
  auto v = f.plane->call(var_op::read, "emb", nullptr, true);
  REQUIRE(v);
  const float want = -static_cast<float>(2 * pushes) / 1024;
  CHECK(v->first.data<float>()[0] == want);
  CHECK(v->first.data<float>()[v->first.num_elements() - 1] == want);
}

TEST_CASE("sync rounds whose pushes come over the data plane and through the actor close once "
          "each, and every member is answered",
          "[sparse_push][data_plane]") {
  // Worker 0 over the data plane, worker 1 through the actor: a round is
  // released by whichever arrives last, on the plane's thread (it answers
  // the actor's promise through the actor: the round holds one) or in the
  // actor (it wakes the plane's thread). Each round applies the mean once.
  plane_fixture f("sync", 2, 256, 8);
  const float g = 1.0f / 512;
  constexpr uint64_t rounds = 200;
  std::string failure;
  std::vector<uint64_t> answered;
  std::thread pusher([&] {
    for (uint64_t k = 1; k <= rounds; ++k) {
      auto r = f.push_plane(*f.plane, 0, k - 1, k, g);
      if (!r) {
        failure = describe(r.error());
        return;
      }
      answered.push_back(*r);
    }
  });
  caf::scoped_actor other{f.sess->system()};
  for (uint64_t k = 1; k <= rounds; ++k) {
    auto r = f.push_caf(other, 1, k - 1, k, g);
    REQUIRE(r);
    CHECK(*r == k);
  }
  pusher.join();
  REQUIRE(failure.empty());
  REQUIRE(answered.size() == rounds);
  for (uint64_t k = 1; k <= rounds; ++k)
    CHECK(answered[k - 1] == k);
  auto s = f.stats();
  CHECK(s.global_step == rounds);
  CHECK(s.applied == rounds);
  auto v = f.plane->call(var_op::read, "emb", nullptr, true);
  REQUIRE(v);
  // The mean of two equal gradients, once a round.
  CHECK(v->first.data<float>()[0] == -static_cast<float>(rounds) / 1024);
}

TEST_CASE("sync rounds whose every push comes over the data plane are taken on the plane's "
          "threads, the last push of a round releases it and wakes the other's thread",
          "[sparse_push][data_plane]") {
  // Catches: a plane path that never takes a push (every push through the
  // actor would pass the tests above), and a release on one plane thread
  // that does not wake the other waiting one (it would time out).
  plane_fixture f("sync", 2, 256, 8);
  const float g = 1.0f / 512;
  constexpr uint64_t rounds = 200;
  auto info = f.sess->ping("ps", 0);
  REQUIRE(info);
  auto second = data_channel::connect("127.0.0.1", info->data_port, "/job:ps/task:0", 5s);
  REQUIRE(second);
  std::atomic<bool> failed{false};
  std::string failure;
  std::thread pusher([&] {
    for (uint64_t k = 1; k <= rounds; ++k)
      if (auto r = f.push_plane(**second, 1, k - 1, k, g); !r || *r != k) {
        failure = r ? "answered step " + std::to_string(*r) : describe(r.error());
        failed = true;
        return;
      }
  });
  for (uint64_t k = 1; k <= rounds && !failed; ++k) {
    auto r = f.push_plane(*f.plane, 0, k - 1, k, g);
    INFO((r ? std::string{} : describe(r.error())));
    REQUIRE(r);
    CHECK(*r == k);
  }
  pusher.join();
  INFO(failure);
  REQUIRE_FALSE(failed);
  auto s = f.stats();
  CHECK(s.global_step == rounds);
  CHECK(s.applied == rounds);
  CHECK(s.pushes_on_plane == 2 * rounds);
  auto v = f.plane->call(var_op::read, "emb", nullptr, true);
  REQUIRE(v);
  CHECK(v->first.data<float>()[0] == -static_cast<float>(rounds) / 1024);
}
