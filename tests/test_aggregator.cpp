// The aggregation actors (actors/aggregator.hpp) on their own: spawned over
// variable cells in one actor system and driven by a scoped actor, and their
// shared round bookkeeping (actors/aggregation_round.hpp) without actors.
// Whole training jobs through them are in test_training.cpp.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "actors/aggregation_round.hpp"
#include "actors/aggregator.hpp"
#include "actors/embedded_cluster.hpp"
#include "actors/system.hpp"
#include "actors/variable.hpp"
#include "messages/error.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

using push_reply = caf::expected<std::pair<uint64_t, tensor>>;

/// An actor system with float32 cells "w" [2, 2] and "b" [3] (each 1 if
/// initialized) and a scoped actor to talk to the aggregator over them. All
/// requests go out from the one scoped actor, so the aggregator gets them in
/// the order the test sends them.
struct aggregator_fixture {
  aggregator_fixture() : sys(cfg), self(sys) {
    // nop
  }

  ~aggregator_fixture() {
    if (agg)
      caf::anon_send_exit(agg, caf::exit_reason::user_shutdown);
  }

  /// Spawns the aggregator of `mode` for `workers` over w and b; b gets a
  /// value only if `init_b`.
  void spawn(const std::string& mode, uint32_t workers, bool init_b = true) {
    std::vector<variable_directory::entry> vars;
    for (auto& [name, shape, init] :
         std::vector<std::tuple<std::string, shape_type, bool>>{{"w", {2, 2}, true},
                                                                {"b", {3}, init_b}}) {
      auto cell = std::make_shared<variable_cell>(variable_spec{name, dtype::float32, shape, ""});
      if (init)
        REQUIRE(cell->initialize(initializer::constant(1), false, "test"));
      vars.push_back({variable_cell_actor{}, cell});
    }
    cells = {vars[0].cell, vars[1].cell};
    aggregator_spec spec;
    spec.name = "test/" + mode;
    spec.mode = mode;
    spec.variables = {"w", "b"};
    spec.workers = workers;
    spec.optimizer.kind = "momentum"; // slots: made on an update's first use
    spec.optimizer.lr = 0.5;
    spec.step_timeout_ms = 60000; // nothing here may end by timing out
    auto a = spawn_aggregator(sys, spec, vars);
    REQUIRE(a);
    agg = *a;
  }

  /// w and b filled with `w` and `b` (b's element `nan_at` NaN if given).
  static std::vector<tensor> values(float w, float b, int nan_at = -1) {
    auto bt = tensor::filled(dtype::float32, {3}, b);
    if (nan_at >= 0)
      bt.mutable_data<float>()[nan_at] = std::nanf("");
    return {tensor::filled(dtype::float32, {2, 2}, w), bt};
  }

  auto push(uint32_t worker, uint64_t step, std::vector<tensor> v) {
    return self->request(agg, 10s, push_atom::value, worker, step, std::move(v));
  }

  template <class Handle>
  static push_reply reply(Handle& h) {
    push_reply out{make_error(af_error::internal, "no reply")};
    h.receive([&](uint64_t g, tensor& p) { out = std::make_pair(g, std::move(p)); },
              [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  push_reply push_now(uint32_t worker, uint64_t step, std::vector<tensor> v) {
    auto h = push(worker, step, std::move(v));
    return reply(h);
  }

  /// The value of cell `i` (w: 0, b: 1) as floats, or empty if it has none.
  std::vector<float> value(size_t i) {
    auto v = cells[i]->apply(var_op::read, tensor{}, true);
    if (!v)
      return {};
    return std::vector<float>(v->value.data<float>(),
                              v->value.data<float>() + v->value.num_elements());
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
  std::vector<std::shared_ptr<variable_cell>> cells;
};

std::vector<float> filled(size_t n, float x) {
  return std::vector<float>(n, x);
}

} // namespace

// -- the round, without actors ----------------------------------------------------

TEST_CASE("a round completes once every worker not done has pushed, and names the missing ones",
          "[aggregator]") {
  // Catches: a release before the last worker, a done worker still waited
  // for, a timeout that names the wrong workers.
  aggregation_round<std::string> r{3, 2};
  CHECK_FALSE(r.in_progress());
  float a[2] = {1, 2};
  r.add({a}, {0}, {2});
  CHECK(r.arrive(0, 7, "w0"));
  CHECK(r.in_progress());
  CHECK(r.step() == 7u);
  CHECK_FALSE(r.complete());
  CHECK(r.missing() == std::vector<uint32_t>{1, 2});
  r.mark_done(2);
  CHECK(r.active() == 2);
  CHECK(r.missing() == std::vector<uint32_t>{1});
  CHECK(r.arrive(1, 7, "w1")); // an abstention: arrives, adds nothing
  CHECK(r.complete());
  CHECK(r.contributions() == 1);
  CHECK(r.mean() == std::vector<float>{1, 2});
}

TEST_CASE("a second push of a round is refused and changes nothing", "[aggregator]") {
  // Catches: a worker's two pushes counted as two workers (the step released
  // without the other), or the duplicate's ticket parked forever.
  aggregation_round<int> r{2, 1};
  CHECK(r.arrive(0, 3, 10));
  CHECK(r.has_arrived(0));
  CHECK_FALSE(r.arrive(0, 3, 11));
  CHECK_FALSE(r.complete());
  auto tickets = r.release();
  REQUIRE(tickets.size() == 1);
  CHECK(tickets[0] == std::make_pair(uint32_t{0}, 10));
}

TEST_CASE("releasing a round hands back every ticket in arrival order and starts an empty one",
          "[aggregator]") {
  // Catches: a parked push left unanswered, a sum or arrival carried into the
  // next round, a mean that is a sum.
  aggregation_round<int> r{2, 3};
  float x[3] = {1, 2, 3};
  float y[3] = {3, 4, 5};
  r.add({x}, {0}, {3});
  r.arrive(1, 0, 101);
  r.add({y}, {0}, {3});
  r.arrive(0, 0, 100);
  REQUIRE(r.complete());
  CHECK(r.mean() == std::vector<float>{2, 3, 4});
  auto tickets = r.release();
  REQUIRE(tickets.size() == 2);
  CHECK(tickets[0] == std::make_pair(uint32_t{1}, 101));
  CHECK(tickets[1] == std::make_pair(uint32_t{0}, 100));
  CHECK_FALSE(r.in_progress());
  CHECK_FALSE(r.has_arrived(0));
  CHECK(r.contributions() == 0);
  CHECK_FALSE(r.step());
  r.add({y}, {0}, {3});
  CHECK(r.arrive(0, 1, 200));
  CHECK(r.mean() == std::vector<float>{3, 4, 5}); // not added to the last round's sum
}

TEST_CASE("a round expires its timeout after its first push, not before", "[aggregator]") {
  // Catches: a round timed from the aggregator's start (or the last push),
  // an idle aggregator that times out.
  using clock_type = aggregation_round<int>::clock_type;
  aggregation_round<int> r{2, 1};
  auto t0 = clock_type::now();
  CHECK_FALSE(r.expired(100ms, t0 + 1s)); // nothing waits
  r.arrive(0, 0, 1, t0);
  CHECK_FALSE(r.expired(100ms, t0 + 99ms));
  CHECK(r.expired(100ms, t0 + 100ms));
}

// -- the actors ---------------------------------------------------------------------

TEST_CASE("a non-finite push is refused as non_finite, naming worker, variable and element",
          "[aggregator]") {
  // Catches: the refusal coded invalid_argument, which the worker cannot tell
  // from a bug of its own (it goes on without the step only for non_finite).
  aggregator_fixture f;
  auto mode = GENERATE(as<std::string>{}, "sync", "async", "average");
  f.spawn(mode, 1);
  auto r = f.push_now(0, mode == "average" ? 1 : 0, aggregator_fixture::values(1, 1, 2));
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::non_finite));
  CHECK_THAT(describe(r.error()),
             Catch::Contains("worker 0") && Catch::Contains("'b'") && Catch::Contains("element 2"));
  CHECK(f.stats().refused == 1);
  CHECK(f.value(1) == filled(3, 1));
}

TEST_CASE("an update refused at the last variable changes no variable", "[aggregator]") {
  // Catches: a partial apply, where w took the update before b's apply
  // failed (b has no value): w and b out of step, and a retry applies to w
  // twice.
  aggregator_fixture f;
  auto mode = GENERATE(as<std::string>{}, "sync", "async", "average");
  f.spawn(mode, 1, false);
  auto r = f.push_now(0, mode == "average" ? 1 : 0, aggregator_fixture::values(2, 2));
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::uninitialized));
  CHECK_THAT(describe(r.error()), Catch::Contains("'b'") && Catch::Contains("no variable"));
  CHECK(f.value(0) == filled(4, 1));
  CHECK_FALSE(f.cells[0]->slot("momentum")); // w's slot not touched either
  CHECK(f.stats().applied == 0);
  // once b has a value, the same push goes through, to both
  REQUIRE(f.cells[1]->initialize(initializer::constant(1), false, "test"));
  auto again = f.push_now(0, mode == "average" ? 1 : 0, aggregator_fixture::values(2, 2));
  REQUIRE(again);
  float want = mode == "average" ? 2.0f : 0.0f; // 1 - 0.5 * 2, or the average of one worker
  CHECK(f.value(0) == filled(4, want));
  CHECK(f.value(1) == filled(3, want));
}

TEST_CASE("a NaN in the last variable leaves every variable's value unchanged", "[aggregator]") {
  // Catches: values checked one variable at a time while applying (w updated
  // before b's NaN is seen).
  aggregator_fixture f;
  auto mode = GENERATE(as<std::string>{}, "sync", "async", "average");
  f.spawn(mode, 1);
  auto r = f.push_now(0, mode == "average" ? 1 : 0, aggregator_fixture::values(2, 2, 0));
  REQUIRE_FALSE(r);
  CHECK(f.value(0) == filled(4, 1));
  CHECK(f.value(1) == filled(3, 1));
}

TEST_CASE("the average aggregator refuses a step far ahead of its round without disturbing it",
          "[aggregator]") {
  // Catches: a push of step 10^12 taken into the round, which would set the
  // global step to 10^12 and end every worker's training at once.
  aggregator_fixture f;
  f.spawn("average", 2);
  auto w0 = f.push(0, 1, aggregator_fixture::values(1, 1));
  auto hostile = f.push_now(1, 1'000'000'000'000, aggregator_fixture::values(5, 5));
  REQUIRE_FALSE(hostile);
  CHECK(is(hostile.error(), af_error::invalid_argument));
  CHECK_THAT(describe(hostile.error()),
             Catch::Contains("worker 1") && Catch::Contains("expected step 1"));
  // the round still waits for worker 1, and completes with its honest push
  auto w1 = f.push(1, 1, aggregator_fixture::values(3, 3));
  auto r0 = aggregator_fixture::reply(w0);
  auto r1 = aggregator_fixture::reply(w1);
  REQUIRE(r0);
  REQUIRE(r1);
  CHECK(r0->first == 1);
  CHECK(r0->second.at(0) == 2.0); // mean(1, 3)
  CHECK(f.value(1) == filled(3, 2));
  // the first push of the next round is bounded by the rounds' stride (1)
  auto first = f.push_now(0, 1'000'000'000'000, aggregator_fixture::values(1, 1));
  REQUIRE_FALSE(first);
  CHECK(is(first.error(), af_error::invalid_argument));
  CHECK_THAT(describe(first.error()),
             Catch::Contains("worker 0") && Catch::Contains("expected step 2 at most"));
  CHECK(f.stats().global_step == 1);
}

TEST_CASE("a restore during a round answers its parked pushes with aborted and clears it",
          "[aggregator]") {
  // Catches: pushes parked for a round that can no longer complete (their
  // workers wait out the step timeout), and arrivals of the old round kept
  // (the worker's next push refused as a second one, or its old gradient
  // added to the new round).
  aggregator_fixture f;
  auto mode = GENERATE(as<std::string>{}, "sync", "average");
  f.spawn(mode, 2);
  aggregator_state saved;
  f.self->request(f.agg, 10s, save_atom::value)
    .receive([&](aggregator_state& s) { saved = std::move(s); },
             [&](caf::error& e) { FAIL(describe(e)); });
  saved.global_step = 5;
  uint64_t step = mode == "sync" ? 0 : 1;
  auto parked = f.push(0, step, aggregator_fixture::values(100, 100));
  auto restored = f.self->request(f.agg, 10s, restore_atom::value, saved);
  restored.receive([&](uint64_t g) { CHECK(g == 5); }, [&](caf::error& e) { FAIL(describe(e)); });
  auto r = aggregator_fixture::reply(parked);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::aborted));
  CHECK_THAT(describe(r.error()), Catch::Contains("restored to global step 5")
                                    && Catch::Contains("worker 1"));
  // a fresh round from the restored step: worker 0 may push again, and only
  // the new pushes count
  step = mode == "sync" ? 5 : 6;
  auto p0 = f.push(0, step, aggregator_fixture::values(1, 1));
  auto p1 = f.push(1, step, aggregator_fixture::values(3, 3));
  auto r0 = aggregator_fixture::reply(p0);
  auto r1 = aggregator_fixture::reply(p1);
  REQUIRE(r0);
  REQUIRE(r1);
  CHECK(r0->first == 6);
  // sync: 1 - 0.5 * mean(1, 3) = 0 (momentum's first step); average: mean(1, 3)
  CHECK(f.value(0) == filled(4, mode == "sync" ? 0.0f : 2.0f));
}

// -- get-or-create by name ------------------------------------------------------------

TEST_CASE("aggregator specs differ by mode, variables, workers and optimizer, not by what "
          "average ignores",
          "[aggregator]") {
  // Catches: a comparison that misses the optimizer or its schedule.
  aggregator_spec a;
  a.name = "x";
  a.variables = {"w"};
  auto b = a;
  CHECK(aggregator_spec_difference(a, b).empty());
  b.optimizer.lr = 0.2;
  CHECK(aggregator_spec_difference(a, b) == "optimizer lr 0.1 vs 0.2");
  b = a;
  b.optimizer.schedule.kind = "cosine";
  CHECK_THAT(aggregator_spec_difference(a, b), Catch::Contains("schedule constant vs cosine"));
  b = a;
  b.workers = 3;
  b.optimizer.kind = "adam";
  CHECK(aggregator_spec_difference(a, b) == "workers 1 vs 3, optimizer sgd vs adam");
  a.mode = b.mode = "average";
  // average applies no optimizer, but its kind names the replicas' slots
  // the aggregator saves and restores (sgd's none would crash adam's apply)
  CHECK(aggregator_spec_difference(a, b) == "workers 1 vs 3, optimizer sgd vs adam");
  b.optimizer.kind = "sgd";
  b.optimizer.lr = 0.7;
  CHECK(aggregator_spec_difference(a, b) == "workers 1 vs 3");
}

TEST_CASE("an average round in which every worker abstains still passes its step", "[aggregator]") {
  // Catches: the global step left at the previous round when nobody
  // contributed, so the next round's pushes (at the next multiple of k)
  // were refused as too far ahead and every worker failed.
  aggregator_fixture f;
  f.spawn("average", 2);
  auto a0 = f.push(0, 4, aggregator_fixture::values(1, 1));
  auto a1 = f.push(1, 4, aggregator_fixture::values(3, 3));
  REQUIRE(aggregator_fixture::reply(a0));
  REQUIRE(aggregator_fixture::reply(a1));
  CHECK(f.stats().global_step == 4); // the stride is now 4
  // step 8: both abstain (a push with no values)
  auto b0 = f.push(0, 8, {});
  auto b1 = f.push(1, 8, {});
  auto rb0 = aggregator_fixture::reply(b0);
  auto rb1 = aggregator_fixture::reply(b1);
  REQUIRE(rb0);
  REQUIRE(rb1);
  CHECK(rb0->first == 8);
  CHECK(f.value(1) == filled(3, 2)); // nothing averaged: still mean(1, 3)
  // step 12 is one stride ahead of 8, not two ahead of 4
  auto c0 = f.push(0, 12, aggregator_fixture::values(5, 5));
  auto c1 = f.push(1, 12, aggregator_fixture::values(7, 7));
  auto rc0 = aggregator_fixture::reply(c0);
  auto rc1 = aggregator_fixture::reply(c1);
  REQUIRE(rc0);
  REQUIRE(rc1);
  CHECK(rc0->first == 12);
  CHECK(f.value(1) == filled(3, 6));
}

TEST_CASE("a node hands back its aggregator only to the same spec", "[aggregator]") {
  // Catches: a second get-or-create with another learning rate or schedule
  // handed the first aggregator, which then trains with the first's.
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("w", {2}, initializer::constant(1)));
  }
  REQUIRE_FALSE(s->initialize());
  aggregator_spec spec;
  spec.name = "test/same";
  spec.mode = "sync";
  spec.variables = {"w"};
  auto first = s->aggregator("ps", 0, spec);
  REQUIRE(first);
  auto same = s->aggregator("ps", 0, spec);
  REQUIRE(same);
  CHECK(*same == *first);
  auto other_lr = spec;
  other_lr.optimizer.lr = 0.3;
  auto r = s->aggregator("ps", 0, other_lr);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::already_exists));
  CHECK_THAT(describe(r.error()), Catch::Contains("'test/same'") && Catch::Contains("lr 0.1 vs 0.3"));
  auto other_schedule = spec;
  other_schedule.optimizer.schedule.kind = "step";
  auto q = s->aggregator("ps", 0, other_schedule);
  REQUIRE_FALSE(q);
  CHECK_THAT(describe(q.error()), Catch::Contains("schedule constant vs step"));
}
