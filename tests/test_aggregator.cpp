// The aggregation actors (dist/aggregator.hpp) on their own: spawned over
// variable cells in one actor system and driven by a scoped actor, and their
// shared round bookkeeping (dist/aggregation_round.hpp) without actors.
// Whole training jobs through them are in test_training.cpp.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "dist/aggregation_round.hpp"
#include "dist/aggregator.hpp"
#include "dist/embedded_cluster.hpp"
#include "actors/system.hpp"
#include "actors/variable.hpp"
#include "messages/error.hpp"
#include "wait.hpp"

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
  /// value only if `init_b`; `adjust` changes the spec before the spawn.
  void spawn(const std::string& mode, uint32_t workers, bool init_b = true,
             const std::function<void(aggregator_spec&)>& adjust = {}) {
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
    if (adjust)
      adjust(spec);
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

  /// Joins `worker` (as `who`, or no actor) and keeps its token; the answer's
  /// global step, or the refusal.
  caf::expected<uint64_t> join(uint32_t worker, const caf::actor& who = {}) {
    caf::expected<uint64_t> out{make_error(af_error::internal, "no reply")};
    self
      ->request(agg, 10s, join_atom::value, worker, "/job:worker/task:" + std::to_string(worker),
                std::string{"127.0.0.1:3334"}, uint32_t{32}, who)
      .receive(
        [&](uint64_t g, std::string& token, uint64_t last_seq) {
          tokens[worker] = std::move(token);
          seqs[worker] = std::max(seqs[worker], last_seq);
          out = g;
        },
        [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  /// What `worker`'s next push carries: its token (joining it first, with
  /// no actor, if it has none) and its next push number.
  push_credentials creds(uint32_t worker) {
    if (tokens[worker].empty())
      REQUIRE(join(worker));
    return push_credentials{tokens[worker], ++seqs[worker], "the test"};
  }

  auto push(uint32_t worker, uint64_t step, std::vector<tensor> v) {
    auto who = creds(worker);
    return self->request(agg, 10s, push_atom::value, worker, step, std::move(who), std::move(v));
  }

  /// The push's answer; `dropped_late` (if given): whether it said the
  /// push was dropped as late.
  template <class Handle>
  static push_reply reply(Handle& h, bool* dropped_late = nullptr) {
    push_reply out{make_error(af_error::internal, "no reply")};
    h.receive(
      [&](uint64_t g, tensor& p, bool late) {
        out = std::make_pair(g, std::move(p));
        if (dropped_late != nullptr)
          *dropped_late = late;
      },
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
  std::map<uint32_t, std::string> tokens; ///< per worker, as its join was answered
  std::map<uint32_t, uint64_t> seqs;      ///< per worker, its last push number
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

TEST_CASE("a round's values kept by reference give the mean of values summed on arrival, bit "
          "for bit, in blocks and parts",
          "[aggregator]") {
  // Catches: the sync release's fused mean (aggregation_round::mean_into,
  // values kept by reference) adding in another order than arrival, scaling
  // twice or not at all, reading the wrong part of a block, or losing a
  // value summed before those kept: each gives other bits than mean() (the
  // values span magnitudes, so float addition order shows), or, past its cap
  // on bytes kept by reference, summing out of arrival order.
  const std::vector<size_t> offsets{0, 700}, sizes{700, 1301};
  const size_t total = 2001;
  std::vector<std::vector<float>> values(3, std::vector<float>(total));
  uint32_t seed = 12345;
  for (auto& v : values)
    for (auto& x : v) {
      seed = seed * 1664525u + 1013904223u;
      x = static_cast<float>(static_cast<int32_t>(seed)) * std::pow(2.0f, float(seed % 40) - 20);
    }
  auto parts = [&](size_t w) {
    return std::vector<const float*>{values[w].data(), values[w].data() + 700};
  };
  auto owner = [&](size_t w) { return std::make_shared<std::vector<float>>(values[w]); };
  aggregation_round<int> summed{3, total};
  for (size_t w = 0; w < 3; ++w)
    summed.add(parts(w), offsets, sizes);
  auto expected = summed.mean();
  auto contributions = GENERATE(1, 2, 3);
  auto first_summed = GENERATE(false, true);
  // the cap on bytes kept by reference: none reached, one value's, none kept
  auto limit = GENERATE(aggregation_round<int>::default_kept_limit, total * sizeof(float),
                        size_t{0});
  aggregation_round<int> kept{3, total, limit};
  std::vector<std::shared_ptr<std::vector<float>>> copies;
  for (size_t w = 0; w < static_cast<size_t>(contributions); ++w) {
    copies.push_back(owner(w));
    auto p = std::vector<const float*>{copies.back()->data(), copies.back()->data() + 700};
    if (w == 0 && first_summed)
      kept.add(p, offsets, sizes);
    else
      kept.add(p, offsets, sizes, copies.back());
  }
  if (contributions < 3) {
    aggregation_round<int> fewer{3, total};
    for (size_t w = 0; w < static_cast<size_t>(contributions); ++w)
      fewer.add(parts(w), offsets, sizes);
    expected = fewer.mean();
  }
  std::vector<float> got(total);
  for (size_t i = 0; i < 2; ++i) // blocks of 256, cut at each part's end
    for (size_t k = 0; k < sizes[i]; k += 256)
      kept.mean_into(offsets[i] + k, std::min<size_t>(256, sizes[i] - k), got.data() + offsets[i] + k);
  CHECK(std::memcmp(got.data(), expected.data(), total * sizeof(float)) == 0);
  // and mean() of the kept values is the same too (average mode reads it so)
  auto whole = kept.mean();
  CHECK(std::memcmp(whole.data(), expected.data(), total * sizeof(float)) == 0);
}

TEST_CASE("a round past its cap on values kept by reference sums the rest on arrival, still in "
          "arrival order",
          "[aggregator]") {
  // Catches: the round keeping workers x model bytes of pushes (no cap), or,
  // past the cap, a value summed before those kept ahead of it: other bits
  // than summing on arrival (float addition is not associative).
  const size_t total = 2001;
  std::vector<std::vector<float>> v(3, std::vector<float>(total));
  uint32_t seed = 12345;
  for (auto& a : v)
    for (auto& x : a) {
      seed = seed * 1664525u + 1013904223u;
      x = static_cast<float>(static_cast<int32_t>(seed)) * std::pow(2.0f, float(seed % 40) - 20);
    }
  const std::vector<size_t> offsets{0}, sizes{total};
  aggregation_round<int> summed{3, total};
  aggregation_round<int> capped{3, total, total * sizeof(float)}; // one value by reference
  for (auto& a : v) {
    summed.add({a.data()}, offsets, sizes);
    capped.add({a.data()}, offsets, sizes, std::make_shared<int>(0));
  }
  std::vector<float> got(total);
  capped.mean_into(0, total, got.data());
  const auto& expected = summed.mean();
  CHECK(std::memcmp(got.data(), expected.data(), total * sizeof(float)) == 0);
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

// -- membership, backup workers, deadlines, ssp and the live switch -----------------

namespace {

/// sgd at lr 0.5: one update of a gradient g moves a value by exactly -g/2,
/// so the parameters show which gradients were applied and how often.
void sgd(aggregator_spec& spec) {
  spec.optimizer.kind = "sgd";
  spec.optimizer.lr = 0.5;
}

std::vector<float> floats(const tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.num_elements());
}

/// The global step the aggregator answers a request of `xs` with, or its error.
template <class... Ts>
caf::expected<uint64_t> ask(aggregator_fixture& f, Ts&&... xs) {
  caf::expected<uint64_t> out{make_error(af_error::internal, "no reply")};
  f.self->request(f.agg, 10s, std::forward<Ts>(xs)...)
    .receive([&](uint64_t g) { out = g; }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<uint64_t> join(aggregator_fixture& f, uint32_t worker, const caf::actor& who) {
  return f.join(worker, who);
}

caf::expected<uint64_t> switch_to(aggregator_fixture& f, const std::string& mode) {
  aggregator_spec want;
  want.mode = mode;
  want.variables = {"w", "b"};
  return ask(f, switch_atom::value, want);
}

void done(aggregator_fixture& f, uint32_t worker) {
  f.self->request(f.agg, 10s, done_atom::value, worker, f.tokens[worker], std::string{})
    .receive([](uint32_t) {}, [](caf::error& e) { FAIL(describe(e)); });
}

/// The first event that contains every one of `parts`, or "".
std::string event_with(const aggregator_stats& s, std::vector<std::string> parts) {
  for (const auto& e : s.events)
    if (std::all_of(parts.begin(), parts.end(),
                    [&](const std::string& p) { return e.find(p) != std::string::npos; }))
      return e;
  return {};
}

/// An actor that stands for a worker's process (the aggregator monitors
/// it); it ends with the scope, so a failed check cannot leave it running
/// (the actor system would wait for it forever).
struct worker_stand_in {
  explicit worker_stand_in(caf::actor_system& sys)
    : actor(sys.spawn([]() -> caf::behavior { return {[](int) {}}; })) {
    // nop
  }

  ~worker_stand_in() { caf::anon_send_exit(actor, caf::exit_reason::kill); }

  caf::actor actor;
};

} // namespace

TEST_CASE("a round with replicas_to_aggregate completes with its first arrivals, and grows when "
          "a worker is added",
          "[aggregator]") {
  // Catches: complete(enough) ignoring `enough` (backup workers wait for
  // everyone), arrivals() counting contributions instead of pushes, and
  // add_worker that does not make the round wait for the newcomer (or makes
  // it wait for the never-seen indices below it).
  aggregation_round<int> r{3, 1};
  CHECK(r.arrivals() == 0);
  CHECK(r.arrive(0, 0, 10));
  CHECK(r.arrivals() == 1);
  CHECK_FALSE(r.complete(2));
  CHECK(r.arrive(2, 0, 12)); // an abstention arrives too
  CHECK(r.arrivals() == 2);
  CHECK(r.complete(2));
  CHECK_FALSE(r.complete());  // every member: worker 1 is missing
  CHECK_FALSE(r.complete(3));
  r.add_worker(4);
  CHECK(r.workers() == 5);
  CHECK(r.active() == 4); // 0, 1, 2 and 4; 3 never joined
  CHECK(r.is_done(3));
  CHECK(r.missing() == std::vector<uint32_t>{1, 4});
  CHECK(r.arrive(1, 0, 11));
  CHECK_FALSE(r.complete());
  CHECK(r.complete(3));
  CHECK(r.arrive(4, 0, 14));
  CHECK(r.complete());
  CHECK(r.release().size() == 4);
  CHECK(r.arrivals() == 0);
  // a done worker that is added again is waited for again
  r.mark_done(1);
  CHECK(r.active() == 3);
  r.add_worker(1);
  CHECK(r.active() == 4);
  CHECK(r.workers() == 5);
}

TEST_CASE("sync with 2 of 3 replicas releases a step with its first two gradients and drops the "
          "third as late, saying so in its answer",
          "[aggregator]") {
  // Catches: a backup worker's late gradient applied (to the next step, or
  // as a second update), its push parked until the next step closes, the
  // late count put on the wrong worker, or the step waiting for all three;
  // and an answer that does not say the push was dropped (its step, 1, is
  // the one a push of step 0 in time gets: the worker cannot tell from it).
  aggregator_fixture f;
  f.spawn("sync", 3, true, [](aggregator_spec& s) {
    sgd(s);
    s.replicas_to_aggregate = 2;
  });
  auto p0 = f.push(0, 0, aggregator_fixture::values(1, 1));
  auto p1 = f.push(1, 0, aggregator_fixture::values(3, 3));
  bool late0 = true;
  bool late1 = true;
  auto r0 = aggregator_fixture::reply(p0, &late0);
  auto r1 = aggregator_fixture::reply(p1, &late1);
  REQUIRE(r0);
  REQUIRE(r1);
  CHECK(r0->first == 1);
  CHECK(r1->first == 1);
  CHECK_FALSE(late0);
  CHECK_FALSE(late1);
  CHECK(floats(r0->second) == filled(7, 0)); // 1 - 0.5 * mean(1, 3)
  auto p2 = f.push(2, 0, aggregator_fixture::values(100, 100));
  bool late2 = false;
  auto late = aggregator_fixture::reply(p2, &late2);
  REQUIRE(late);
  CHECK(late->first == 1);
  CHECK(late2);
  CHECK(floats(late->second) == filled(7, 0));
  CHECK(f.value(0) == filled(4, 0));
  auto s = f.stats();
  CHECK(s.global_step == 1);
  CHECK(s.applied == 1);
  CHECK(s.dropped_stale == 1);
  REQUIRE(s.workers.size() == 3);
  CHECK(s.workers[0].late == 0);
  CHECK(s.workers[1].late == 0);
  CHECK(s.workers[2].late == 1);
  CHECK(s.workers[0].applied == 1);
  CHECK(s.workers[1].applied == 1);
  CHECK(s.workers[2].applied == 0);
  CHECK(s.workers[2].pushes == 1);
  // Its retry (the same push number: the answer was lost on the way) is
  // answered "dropped as late" again, not as a push taken in time; a
  // retry of a push taken in time is not.
  push_credentials again{f.tokens[2], f.seqs[2], "the test"};
  auto retry = f.self->request(f.agg, 10s, push_atom::value, uint32_t{2}, uint64_t{0}, again,
                               aggregator_fixture::values(100, 100));
  bool late_retry = false;
  REQUIRE(aggregator_fixture::reply(retry, &late_retry));
  CHECK(late_retry);
  push_credentials again0{f.tokens[0], f.seqs[0], "the test"};
  auto retry0 = f.self->request(f.agg, 10s, push_atom::value, uint32_t{0}, uint64_t{0}, again0,
                                aggregator_fixture::values(1, 1));
  bool late_retry0 = true;
  REQUIRE(aggregator_fixture::reply(retry0, &late_retry0));
  CHECK_FALSE(late_retry0);
  CHECK(f.stats().applied == 1);
}

namespace {

/// Asks `f`'s aggregator whether `worker`'s step `step` closed without it:
/// (global step, closed), or the refusal.
caf::expected<std::pair<uint64_t, bool>> ask_closed(aggregator_fixture& f, uint32_t worker,
                                                    uint64_t step, const std::string& token) {
  caf::expected<std::pair<uint64_t, bool>> out{make_error(af_error::internal, "no reply")};
  f.self->request(f.agg, 10s, closed_atom::value, worker, step, token)
    .receive([&](uint64_t g, bool closed) { out = std::make_pair(g, closed); },
             [&](caf::error& e) { out = std::move(e); });
  return out;
}

} // namespace

TEST_CASE("sync with 2 of 3 replicas tells a backup worker that its step closed (closed), "
          "counts it as skipped, and says open for the step in progress",
          "[aggregator]") {
  // Catches: a closed step answered as open (the worker would compute and
  // send a gradient only to have it dropped), the step in progress answered
  // as closed (a gradient that would count lost), a skip not counted on its
  // worker (or counted as a push or a late one), a query without the
  // worker's token believed, and another mode saying closed.
  aggregator_fixture f;
  f.spawn("sync", 3, true, [](aggregator_spec& s) {
    sgd(s);
    s.replicas_to_aggregate = 2;
  });
  REQUIRE(f.join(2));
  auto before = ask_closed(f, 2, 0, f.tokens[2]);
  REQUIRE(before);
  CHECK(*before == std::make_pair(uint64_t{0}, false));
  auto p0 = f.push(0, 0, aggregator_fixture::values(1, 1));
  auto p1 = f.push(1, 0, aggregator_fixture::values(3, 3));
  REQUIRE(aggregator_fixture::reply(p0));
  REQUIRE(aggregator_fixture::reply(p1));
  auto after = ask_closed(f, 2, 0, f.tokens[2]);
  REQUIRE(after);
  CHECK(*after == std::make_pair(uint64_t{1}, true));
  auto now = ask_closed(f, 2, 1, f.tokens[2]);
  REQUIRE(now);
  CHECK(*now == std::make_pair(uint64_t{1}, false));
  auto forged = ask_closed(f, 2, 0, std::string(16, 'x'));
  REQUIRE_FALSE(forged);
  CHECK(is(forged.error(), af_error::invalid_argument));
  auto s = f.stats();
  REQUIRE(s.workers.size() == 3);
  CHECK(s.workers[2].skipped == 1);
  CHECK(s.workers[2].pushes == 0);
  CHECK(s.workers[2].late == 0);
  CHECK(s.workers[0].skipped == 0);
  CHECK(s.dropped_stale == 0);
  CHECK(f.value(0) == filled(4, 0)); // 1 - 0.5 * mean(1, 3): worker 2 took no part

  aggregator_fixture a;
  a.spawn("async", 2);
  REQUIRE(a.push_now(0, 0, aggregator_fixture::values(1, 1)));
  REQUIRE(a.join(1));
  auto async_answer = ask_closed(a, 1, 0, a.tokens[1]);
  REQUIRE(async_answer);
  CHECK(*async_answer == std::make_pair(uint64_t{1}, false));
}

TEST_CASE("a sync step closes at its deadline with min_replicas gradients", "[aggregator]") {
  // Catches: a deadline that never fires (the step waits for the missing
  // worker until the timeout), one that closes without applying what
  // arrived, or a parked push's wait not counted in its worker's waited_ms.
  aggregator_fixture f;
  f.spawn("sync", 2, true, [](aggregator_spec& s) {
    sgd(s);
    s.replicas_to_aggregate = 2;
    s.min_replicas = 1;
    s.step_deadline_ms = 100;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r = f.push_now(0, 0, aggregator_fixture::values(2, 2));
  auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE(r);
  CHECK(r->first == 1);
  CHECK(took >= 100ms);
  CHECK(f.value(0) == filled(4, 0)); // 1 - 0.5 * 2: worker 0's gradient alone
  auto s = f.stats();
  CHECK(s.closed_at_deadline == 1);
  CHECK(s.applied == 1);
  CHECK(s.workers[0].applied == 1);
  CHECK(s.workers[0].waited_ms >= 100);
  CHECK(s.workers[1].waited_ms == 0);
  // the missing worker's gradient of that step comes too late
  auto late = f.push_now(1, 0, aggregator_fixture::values(9, 9));
  REQUIRE(late);
  CHECK(late->first == 1);
  CHECK(f.stats().workers[1].late == 1);
  CHECK(f.value(0) == filled(4, 0));
}

TEST_CASE("a sync step short of min_replicas at its deadline waits on and times out naming the "
          "missing worker",
          "[aggregator]") {
  // Catches: a deadline that closes a step with fewer than min_replicas
  // gradients, or one that, not closing, fails the push at once instead of
  // waiting for step_timeout_ms.
  aggregator_fixture f;
  f.spawn("sync", 2, true, [](aggregator_spec& s) {
    sgd(s);
    s.replicas_to_aggregate = 2;
    s.min_replicas = 2;
    s.step_deadline_ms = 100;
    s.step_timeout_ms = 400;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r = f.push_now(0, 0, aggregator_fixture::values(2, 2));
  auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::timeout));
  CHECK_THAT(describe(r.error()), Catch::Contains("worker 1") && !Catch::Contains("worker 0"));
  CHECK(took >= 400ms);
  auto s = f.stats();
  CHECK(s.closed_at_deadline == 0);
  CHECK(s.global_step == 0);
  CHECK(s.applied == 0);
  CHECK(f.value(0) == filled(4, 1));
}

TEST_CASE("ssp holds a worker more than staleness ahead of the slowest until it catches up",
          "[aggregator]") {
  // Catches: a bound off by one (the third push of s = 2 answered, or the
  // second held), a held push answered before the slowest pushes (or never),
  // and a held worker not shown as held.
  aggregator_fixture f;
  f.spawn("ssp", 2, true, [](aggregator_spec& s) {
    s.staleness = 2;
    s.step_timeout_ms = 5000; // a push held by mistake fails well before the test's 10 s
  });
  caf::scoped_actor w0{f.sys}; // worker 0's answers come only here
  auto push0 = [&](uint64_t step) {
    return w0->request(f.agg, 10s, push_atom::value, uint32_t{0}, step, f.creds(0),
                       aggregator_fixture::values(1, 1));
  };
  auto a = push0(0);
  auto ra = aggregator_fixture::reply(a);
  REQUIRE(ra);
  auto b = push0(ra->first);
  auto rb = aggregator_fixture::reply(b);
  REQUIRE(rb);
  CHECK(rb->first == 2);
  auto held = push0(rb->first);
  auto s = f.stats(); // answered after the aggregator took the third push
  CHECK(s.workers[0].status == "held");
  CHECK(s.workers[0].clock == 3);
  CHECK(s.workers[1].clock == 0);
  CHECK(s.workers[1].status == "member");
  CHECK(s.applied == 3); // applied at once, only the answer waits
  CHECK_FALSE(w0->has_next_message());
  auto slow = f.push_now(1, 0, aggregator_fixture::values(1, 1));
  REQUIRE(slow);
  CHECK(slow->first == 4);
  // the release came before the slow worker's own answer
  CHECK(w0->has_next_message());
  auto rh = aggregator_fixture::reply(held);
  REQUIRE(rh);
  CHECK(rh->first == 4);
  s = f.stats();
  CHECK(s.workers[0].status == "member");
  CHECK(s.workers[1].clock == 1);
}

TEST_CASE("ssp with staleness 0 is lockstep: each push waits for the other worker's",
          "[aggregator]") {
  // Catches: a bound that lets a worker one push ahead with s = 0, or a
  // release that waits for a second push of the slow worker.
  aggregator_fixture f;
  f.spawn("ssp", 2, true, [](aggregator_spec& s) {
    s.staleness = 0;
    s.step_timeout_ms = 5000;
  });
  caf::scoped_actor w0{f.sys};
  auto push0 = [&](uint64_t step) {
    return w0->request(f.agg, 10s, push_atom::value, uint32_t{0}, step, f.creds(0),
                       aggregator_fixture::values(1, 1));
  };
  auto a0 = push0(0);
  CHECK(f.stats().workers[0].status == "held");
  CHECK_FALSE(w0->has_next_message());
  auto a1 = f.push_now(1, 0, aggregator_fixture::values(1, 1));
  REQUIRE(a1);
  REQUIRE(aggregator_fixture::reply(a0));
  // now worker 1 runs ahead and waits for worker 0
  auto b1 = f.push(1, 2, aggregator_fixture::values(1, 1));
  CHECK(f.stats().workers[1].status == "held");
  auto b0 = push0(2);
  auto rb0 = aggregator_fixture::reply(b0);
  REQUIRE(rb0);
  auto rb1 = aggregator_fixture::reply(b1);
  REQUIRE(rb1);
  CHECK(rb1->first == 4);
  auto s = f.stats();
  CHECK(s.workers[0].clock == 2);
  CHECK(s.workers[1].clock == 2);
  CHECK(s.workers[0].status == "member");
  CHECK(s.workers[1].status == "member");
}

TEST_CASE("ssp with a huge staleness trains exactly as async", "[aggregator]") {
  // Catches: ssp applying differently from async (another step counter for
  // the optimizer, a staleness measured from the clock), or holding a push
  // that no bound should hold.
  aggregator_fixture async_f;
  aggregator_fixture ssp_f;
  async_f.spawn("async", 2);
  ssp_f.spawn("ssp", 2, true, [](aggregator_spec& s) {
    s.staleness = 1'000'000;
    s.step_timeout_ms = 500; // a wrongly held push fails fast instead of hanging
  });
  struct push_of {
    uint32_t worker;
    uint64_t step;
    float g;
  };
  std::vector<push_of> pushes{{0, 0, 0.25f}, {0, 1, -1.5f}, {0, 2, 3.0f}, {0, 3, 0.125f},
                              {0, 4, 2.0f},  {1, 0, 7.0f},  {1, 6, -0.75f}, {0, 5, 1.0f}};
  for (const auto& p : pushes) {
    auto ra = async_f.push_now(p.worker, p.step, aggregator_fixture::values(p.g, -p.g));
    auto rs = ssp_f.push_now(p.worker, p.step, aggregator_fixture::values(p.g, -p.g));
    REQUIRE(ra);
    REQUIRE(rs);
    CHECK(ra->first == rs->first);
    CHECK(floats(ra->second) == floats(rs->second));
  }
  CHECK(async_f.value(0) == ssp_f.value(0));
  CHECK(async_f.value(1) == ssp_f.value(1));
  auto sa = async_f.stats();
  auto ss = ssp_f.stats();
  CHECK(sa.global_step == ss.global_step);
  CHECK(sa.staleness == ss.staleness);
  for (const auto& w : ss.workers)
    CHECK(w.status == "member");
  CHECK(ss.workers[0].clock == 6);
  CHECK(ss.workers[1].clock == 2);
}

TEST_CASE("ssp lets a held worker go when the slow one says done, and times out naming it "
          "otherwise",
          "[aggregator]") {
  // Catches: a done worker still counted as the slowest (its peers held
  // until their timeout), and a held push that waits forever, or whose
  // timeout does not say whom it waited for.
  aggregator_fixture f;
  auto slow_is_done = GENERATE(true, false);
  f.spawn("ssp", 2, true, [](aggregator_spec& s) {
    s.staleness = 0;
    s.step_timeout_ms = 300;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto held = f.push(0, 0, aggregator_fixture::values(1, 1));
  if (slow_is_done) {
    done(f, 1);
    auto r = aggregator_fixture::reply(held);
    REQUIRE(r);
    CHECK(r->first == 1);
    CHECK(std::chrono::steady_clock::now() - t0 < 300ms);
    CHECK(f.stats().workers[1].status == "done");
  } else {
    auto r = aggregator_fixture::reply(held);
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::timeout));
    CHECK_THAT(describe(r.error()), Catch::Contains("worker 1 (clock 0)"));
    CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
  }
  CHECK(f.stats().workers[0].status == "member");
}

TEST_CASE("a live switch from sync to async answers the parked pushes and back to sync takes "
          "each worker's older step once",
          "[aggregator]") {
  // Catches: parked pushes left waiting for a round the new mode never
  // closes, their mean applied twice or not at all, async dropping a
  // gradient of an older step as sync would, sync dropping the first push
  // after a switch as late (every worker's step lags the async steps), or
  // a second old push taken as fresh too.
  aggregator_fixture f;
  f.spawn("sync", 3, true, sgd);
  auto p0 = f.push(0, 0, aggregator_fixture::values(1, 1));
  auto p1 = f.push(1, 0, aggregator_fixture::values(3, 3));
  auto g = switch_to(f, "async");
  REQUIRE(g);
  CHECK(*g == 1);
  auto r0 = aggregator_fixture::reply(p0);
  auto r1 = aggregator_fixture::reply(p1);
  REQUIRE(r0);
  REQUIRE(r1);
  CHECK(r0->first == 1);
  CHECK(r1->first == 1);
  CHECK(floats(r0->second) == filled(7, 0)); // 1 - 0.5 * mean(1, 3), once
  // async: worker 2's gradient of step 0 is applied, stale by one
  auto a2 = f.push_now(2, 0, aggregator_fixture::values(2, 2));
  REQUIRE(a2);
  CHECK(a2->first == 2);
  CHECK(f.value(0) == filled(4, -1));
  auto s = f.stats();
  CHECK(s.mode == "async");
  CHECK(s.workers[2].late == 0);
  CHECK(s.workers[2].applied == 1);
  CHECK(s.workers[2].stale == 1);
  // back to sync: each worker's first push joins the round whatever its step
  g = switch_to(f, "sync");
  REQUIRE(g);
  CHECK(*g == 2);
  auto q0 = f.push(0, 1, aggregator_fixture::values(2, 2));
  auto q1 = f.push(1, 1, aggregator_fixture::values(2, 2));
  auto q2 = f.push(2, 2, aggregator_fixture::values(2, 2));
  for (auto* h : {&q0, &q1, &q2}) {
    auto r = aggregator_fixture::reply(*h);
    REQUIRE(r);
    CHECK(r->first == 3);
  }
  CHECK(f.value(0) == filled(4, -2));
  // only the first: a second push of an old step is late again
  auto old = f.push_now(0, 1, aggregator_fixture::values(50, 50));
  REQUIRE(old);
  CHECK(old->first == 3);
  CHECK(f.value(0) == filled(4, -2));
  s = f.stats();
  CHECK(s.mode == "sync");
  CHECK(s.switches == 2);
  CHECK(s.applied == 3); // sync's mean, async's one, sync's mean
  CHECK(s.dropped_stale == 1);
  uint64_t pushes = 0;
  for (const auto& w : s.workers) {
    CHECK(w.pushes == w.applied + w.late + w.refused);
    pushes += w.pushes;
  }
  CHECK(pushes == s.pushes);
  CHECK(s.workers[0].late == 1);
  CHECK(s.workers[1].late == 0);
  CHECK_FALSE(event_with(s, {"mode sync -> async", "global step 1"}).empty());
  CHECK_FALSE(event_with(s, {"mode async -> sync", "global step 2"}).empty());
}

TEST_CASE("a live switch between sync and average drains the round, and each side refuses the "
          "other kind of push as mode_changed",
          "[aggregator]") {
  // Catches: a switch into average that takes the gradient-pushing
  // workers' pushes as parameters (a gradient averaged into the values), a
  // switch out of average that takes parameters as a gradient, and a drain
  // that loses the parked gradient or applies it twice.
  aggregator_fixture f;
  f.spawn("sync", 2, true, sgd);
  auto p0 = f.push(0, 0, aggregator_fixture::values(2, 2));
  auto g = switch_to(f, "average");
  REQUIRE(g);
  CHECK(*g == 1);
  auto r0 = aggregator_fixture::reply(p0);
  REQUIRE(r0);
  CHECK(r0->first == 1);
  CHECK(f.value(0) == filled(4, 0)); // 1 - 0.5 * 2, once
  // a plain push is a gradient of a worker still on the old loop
  auto grad = f.push_now(1, 0, aggregator_fixture::values(2, 2));
  REQUIRE_FALSE(grad);
  CHECK(is(grad.error(), af_error::mode_changed));
  CHECK_THAT(describe(grad.error()), Catch::Contains("runs average now"));
  CHECK(f.value(0) == filled(4, 0));
  // parameters make the round: their mean becomes the value
  auto params = [&](uint32_t w, uint64_t step, float x) {
    return f.self->request(f.agg, 10s, push_atom::value, params_atom::value, w, step,
                           f.creds(w), aggregator_fixture::values(x, x));
  };
  auto a0 = params(0, 3, 4);
  auto a1 = params(1, 3, 8);
  for (auto* h : {&a0, &a1}) {
    auto r = aggregator_fixture::reply(*h);
    REQUIRE(r);
    CHECK(r->first == 3);
  }
  CHECK(f.value(0) == filled(4, 6));
  // back to sync: parameters are refused as the other kind, gradients apply
  g = switch_to(f, "sync");
  REQUIRE(g);
  auto late_params = params(0, 6, 1);
  auto lp = aggregator_fixture::reply(late_params);
  REQUIRE_FALSE(lp);
  CHECK(is(lp.error(), af_error::mode_changed));
  CHECK_THAT(describe(lp.error()), Catch::Contains("runs sync now") && Catch::Contains("parameters"));
  auto q0 = f.push(0, 3, aggregator_fixture::values(2, 2));
  REQUIRE(f.push_now(1, 3, aggregator_fixture::values(2, 2)));
  REQUIRE(aggregator_fixture::reply(q0));
  CHECK(f.value(0) == filled(4, 5)); // 6 - 0.5 * 2
  auto s = f.stats();
  CHECK(s.mode == "sync");
  CHECK(s.switches == 2);
}

TEST_CASE("a worker beyond the config joins, rounds wait for it, and it leaves when its actor "
          "goes down",
          "[aggregator]") {
  // Catches: a push from an unknown index accepted (or crashing the round),
  // a joined worker that rounds do not wait for, a dead worker waited for
  // until the step timeout, messages that do not name its task and address.
  aggregator_fixture f;
  f.spawn("sync", 2, true, sgd);
  // (not joined, so with no token)
  auto h = f.self->request(f.agg, 10s, push_atom::value, uint32_t{2}, uint64_t{0},
                           push_credentials{}, aggregator_fixture::values(1, 1));
  auto stranger = aggregator_fixture::reply(h);
  REQUIRE_FALSE(stranger);
  CHECK(is(stranger.error(), af_error::invalid_argument));
  CHECK_THAT(describe(stranger.error()), Catch::Contains("worker 2") && Catch::Contains("join"));
  auto far = join(f, 70000, caf::actor{});
  REQUIRE_FALSE(far);
  CHECK(is(far.error(), af_error::invalid_argument));
  CHECK_THAT(describe(far.error()), Catch::Contains("70000"));
  worker_stand_in who{f.sys};
  auto g = join(f, 2, who.actor);
  REQUIRE(g);
  CHECK(*g == 0);
  auto s = f.stats();
  REQUIRE(s.workers.size() == 3);
  CHECK(s.workers[2].task == "/job:worker/task:2");
  CHECK(s.workers[2].address == "127.0.0.1:3334");
  CHECK(s.workers[2].batch_size == 32);
  CHECK(s.workers[2].status == "member");
  CHECK(s.active == 3);
  CHECK_FALSE(event_with(s, {"worker 2 (/job:worker/task:2 at 127.0.0.1:3334)", "joined"}).empty());
  // a round of 3: two pushes do not release it
  auto p0 = f.push(0, 0, aggregator_fixture::values(1, 1));
  auto p1 = f.push(1, 0, aggregator_fixture::values(3, 3));
  CHECK(f.stats().global_step == 0);
  caf::anon_send_exit(who.actor, caf::exit_reason::kill);
  auto r0 = aggregator_fixture::reply(p0);
  auto r1 = aggregator_fixture::reply(p1);
  REQUIRE(r0);
  REQUIRE(r1);
  CHECK(r0->first == 1);
  CHECK(f.value(0) == filled(4, 0)); // the two that came
  s = f.stats();
  CHECK(s.workers[2].status == "left");
  CHECK(s.active == 2);
  CHECK_FALSE(
    event_with(s, {"worker 2 (/job:worker/task:2 at 127.0.0.1:3334) left at global step 0"})
      .empty());
  // it does not come back by pushing
  auto again = f.push_now(2, 1, aggregator_fixture::values(1, 1));
  REQUIRE_FALSE(again);
  CHECK_THAT(describe(again.error()), Catch::Contains("/job:worker/task:2"));
  // the next round is the two again
  auto n0 = f.push(0, 1, aggregator_fixture::values(1, 1));
  REQUIRE(f.push_now(1, 1, aggregator_fixture::values(1, 1)));
  REQUIRE(aggregator_fixture::reply(n0));
}

TEST_CASE("a second process for a member's index is refused while the first is up, and comes in "
          "once the first has gone",
          "[aggregator]") {
  // Catches: a second --join for a live member's index (a mistyped --task)
  // taking over that worker's membership, so both processes' pushes
  // collide ("pushed twice") and both fail.
  aggregator_fixture f;
  f.spawn("sync", 2, true, sgd);
  worker_stand_in first{f.sys};
  worker_stand_in second{f.sys};
  REQUIRE(join(f, 1, first.actor));
  REQUIRE(join(f, 1, first.actor)); // the same process again: fine
  auto taken = join(f, 1, second.actor);
  REQUIRE_FALSE(taken);
  CHECK(is(taken.error(), af_error::already_exists));
  CHECK_THAT(describe(taken.error()),
             Catch::Contains("worker 1 (/job:worker/task:1") && Catch::Contains("member already"));
  CHECK(f.stats().workers[1].status == "member");
  caf::anon_send_exit(first.actor, caf::exit_reason::kill);
  REQUIRE(eventually([&] { return f.stats().workers[1].status == "left"; }));
  auto back = join(f, 1, second.actor);
  REQUIRE(back);
  CHECK(f.stats().workers[1].status == "member");
}

TEST_CASE("a joined worker that says done leaves, and its rounds stop waiting for it",
          "[aggregator]") {
  // Catches: done of a worker beyond the config not counted as leaving (the
  // round waits for it), or counted without an event naming it.
  aggregator_fixture f;
  f.spawn("sync", 1, true, sgd);
  worker_stand_in who{f.sys};
  REQUIRE(join(f, 1, who.actor));
  auto p0 = f.push(0, 0, aggregator_fixture::values(2, 2));
  CHECK(f.stats().global_step == 0);
  done(f, 1);
  auto r0 = aggregator_fixture::reply(p0);
  REQUIRE(r0);
  CHECK(r0->first == 1);
  auto s = f.stats();
  CHECK(s.workers[1].status == "left");
  CHECK(s.workers_done == 1);
  CHECK_FALSE(event_with(s, {"/job:worker/task:1", "left", "done"}).empty());
}

TEST_CASE("a parked push's wait shows in its worker's waited_ms while it waits, and counts once",
          "[aggregator]") {
  // Catches: waited_ms that stays 0 while a push is stuck (the status line
  // cannot show who waits), and a wait counted again after its release.
  aggregator_fixture f;
  auto mode = GENERATE(as<std::string>{}, "sync", "ssp");
  f.spawn(mode, 2, true, [](aggregator_spec& s) {
    s.staleness = 0;
    s.step_timeout_ms = 5000;
  });
  auto parked = f.push(0, 0, aggregator_fixture::values(1, 1));
  uint64_t seen = 0;
  CHECK(eventually(
    [&] {
      seen = f.stats().workers[0].waited_ms;
      return seen >= 30;
    },
    1s));
  REQUIRE(f.push_now(1, 0, aggregator_fixture::values(1, 1)));
  REQUIRE(aggregator_fixture::reply(parked));
  auto after = f.stats().workers[0].waited_ms;
  CHECK(after >= seen);
  CHECK(after < seen + 500);
  CHECK(f.stats().workers[0].waited_ms == after); // no longer waiting: no longer growing
  CHECK(f.stats().workers[1].waited_ms == 0);
}

TEST_CASE("a switch out of ssp answers its held pushes and the clocks start over",
          "[aggregator]") {
  // Catches: a held push left waiting after the switch (async never
  // releases it), or ssp clocks kept across a switch so that a return to
  // ssp holds a worker for pushes made under another mode.
  aggregator_fixture f;
  f.spawn("ssp", 2, true, [](aggregator_spec& s) {
    s.staleness = 0;
    s.step_timeout_ms = 5000;
  });
  auto held = f.push(0, 0, aggregator_fixture::values(1, 1));
  CHECK(f.stats().workers[0].status == "held");
  auto g = switch_to(f, "async");
  REQUIRE(g);
  CHECK(*g == 1);
  auto r = aggregator_fixture::reply(held);
  REQUIRE(r);
  CHECK(r->first == 1);
  auto s = f.stats();
  CHECK(s.workers[0].status == "member");
  CHECK(s.workers[0].clock == 0);
  CHECK(s.switches == 1);
  // async: worker 0 runs ahead freely
  REQUIRE(f.push_now(0, 1, aggregator_fixture::values(1, 1)));
  REQUIRE(f.push_now(0, 2, aggregator_fixture::values(1, 1)));
  // back to ssp with staleness 1: level clocks, so worker 0's first push is answered
  aggregator_spec want;
  want.mode = "ssp";
  want.variables = {"w", "b"};
  want.staleness = 1;
  g = ask(f, switch_atom::value, want);
  REQUIRE(g);
  CHECK(*g == 3);
  auto a = f.push_now(0, 3, aggregator_fixture::values(1, 1));
  REQUIRE(a);
  CHECK(a->first == 4);
  auto second = f.push(0, 4, aggregator_fixture::values(1, 1));
  CHECK(f.stats().workers[0].status == "held"); // 2 ahead of worker 1's 0
  REQUIRE(f.push_now(1, 0, aggregator_fixture::values(1, 1)));
  REQUIRE(aggregator_fixture::reply(second));
}

TEST_CASE("ssp lets a held worker go when the slowest, a joined worker, goes down",
          "[aggregator]") {
  // Catches: a departed worker still counted as the slowest, so its peers
  // are held until the step timeout.
  aggregator_fixture f;
  f.spawn("ssp", 1, true, [](aggregator_spec& s) {
    s.staleness = 0;
    s.step_timeout_ms = 5000;
  });
  worker_stand_in who{f.sys};
  REQUIRE(join(f, 1, who.actor));
  auto held = f.push(0, 0, aggregator_fixture::values(1, 1));
  CHECK(f.stats().workers[0].status == "held");
  caf::anon_send_exit(who.actor, caf::exit_reason::kill);
  auto t0 = std::chrono::steady_clock::now();
  auto r = aggregator_fixture::reply(held);
  REQUIRE(r);
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  auto s = f.stats();
  CHECK(s.workers[1].status == "left");
  CHECK_FALSE(event_with(s, {"/job:worker/task:1", "left"}).empty());
}

TEST_CASE("every sync step gets its own deadline", "[aggregator]") {
  // Catches: a deadline acted on only once per aggregator (the second slow
  // step waits until the timeout), or timed from the first step's start
  // (the second closes at once, with nothing in it).
  aggregator_fixture f;
  f.spawn("sync", 3, true, [](aggregator_spec& s) {
    sgd(s);
    s.min_replicas = 1;
    s.step_deadline_ms = 60;
    s.step_timeout_ms = 5000;
  });
  for (uint64_t step = 0; step < 3; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    auto p0 = f.push(0, step, aggregator_fixture::values(1, 1));
    auto r1 = f.push_now(1, step, aggregator_fixture::values(1, 1));
    auto r0 = aggregator_fixture::reply(p0);
    REQUIRE(r0);
    REQUIRE(r1);
    CHECK(r0->first == step + 1);
    CHECK(std::chrono::steady_clock::now() - t0 >= 60ms);
  }
  auto s = f.stats();
  CHECK(s.closed_at_deadline == 3);
  CHECK(s.applied == 3);
  CHECK(f.value(0) == filled(4, -0.5f)); // three steps of 1 - 0.5 * mean(1, 1)
}

TEST_CASE("a worker joining a running ssp job starts level with the slowest member",
          "[aggregator]") {
  // Catches: a newcomer starting at clock 0, which would hold every member
  // until it had made up all the pushes of the job so far.
  aggregator_fixture f;
  f.spawn("ssp", 1, true, [](aggregator_spec& s) {
    s.staleness = 1;
    s.step_timeout_ms = 5000;
  });
  for (uint64_t step = 0; step < 3; ++step)
    REQUIRE(f.push_now(0, step, aggregator_fixture::values(1, 1)));
  worker_stand_in who{f.sys};
  REQUIRE(join(f, 1, who.actor));
  auto s = f.stats();
  CHECK(s.workers[0].clock == 3);
  CHECK(s.workers[1].clock == 3);
  REQUIRE(f.push_now(0, 3, aggregator_fixture::values(1, 1))); // 1 ahead: answered
  auto held = f.push(0, 4, aggregator_fixture::values(1, 1));   // 2 ahead: held
  CHECK(f.stats().workers[0].status == "held");
  REQUIRE(f.push_now(1, 5, aggregator_fixture::values(1, 1)));
  REQUIRE(aggregator_fixture::reply(held));
}

// -- membership: who a push or a done speaks for ---------------------------------

TEST_CASE("a push that does not carry the token its worker joined with is refused and changes "
          "nothing, the member's own push of that step goes in",
          "[aggregator][members]") {
  // Catches: a push that claims a member's index being taken on the index
  // alone (a forged gradient 10^30 times the others' destroyed the model,
  // and the real worker's push of that step was then refused as a second
  // one), and a push for an index that never joined.
  aggregator_fixture f;
  f.spawn("sync", 2, true, sgd);
  REQUIRE(f.join(0));
  REQUIRE(f.join(1));
  auto forged = [&](std::string token) {
    caf::expected<std::pair<uint64_t, tensor>> out{make_error(af_error::internal, "no reply")};
    f.self
      ->request(f.agg, 10s, push_atom::value, uint32_t{1}, uint64_t{0},
                push_credentials{std::move(token), 1, "the forger"},
                aggregator_fixture::values(1e30f, 1e30f))
      .receive([&](uint64_t g, tensor& p, bool) { out = std::make_pair(g, std::move(p)); },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  };
  auto wrong = f.tokens[1];
  wrong[0] = static_cast<char>(wrong[0] ^ 1);
  for (const auto& token : {std::string{}, wrong, std::string(16, '\0'), f.tokens[0]}) {
    auto r = forged(token);
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::invalid_argument));
    CHECK_THAT(describe(r.error()),
               Catch::Contains("worker 1") && Catch::Contains("from the forger")
                 && Catch::Contains("token"));
  }
  // an index that never joined
  auto stranger = [&] {
    caf::expected<std::pair<uint64_t, tensor>> out{make_error(af_error::internal, "no reply")};
    f.self
      ->request(f.agg, 10s, push_atom::value, uint32_t{7}, uint64_t{0},
                push_credentials{f.tokens[1], 1, "the forger"}, aggregator_fixture::values(1, 1))
      .receive([&](uint64_t g, tensor& p, bool) { out = std::make_pair(g, std::move(p)); },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  }();
  REQUIRE_FALSE(stranger);
  CHECK_THAT(describe(stranger.error()), Catch::Contains("has not joined"));
  auto s = f.stats();
  CHECK(s.pushes == 0);
  CHECK(s.global_step == 0);
  CHECK_THAT(s.last_refusal, Catch::Contains("from the forger"));
  // the members' own pushes of step 0 make the round: mean(2, 4) = 3, lr 0.5
  auto p0 = f.push(0, 0, aggregator_fixture::values(2, 2));
  auto r1 = f.push_now(1, 0, aggregator_fixture::values(4, 4));
  REQUIRE(r1);
  CHECK(r1->first == 1);
  REQUIRE(aggregator_fixture::reply(p0));
  CHECK(f.value(0) == filled(4, 1 - 0.5f * 3));
}

TEST_CASE("a refused join does not retire the live member: only its own token says done",
          "[aggregator][members]") {
  // Catches: the refused process's exit (its done for the index) marking the
  // live worker done, so its next push failed and the job went on without it.
  aggregator_fixture f;
  f.spawn("sync", 2, true, sgd);
  worker_stand_in live{f.sys};
  worker_stand_in intruder{f.sys};
  REQUIRE(f.join(0));
  REQUIRE(f.join(1, live.actor));
  auto token = f.tokens[1];
  auto taken = f.join(1, intruder.actor);
  REQUIRE_FALSE(taken);
  CHECK(is(taken.error(), af_error::already_exists));
  // nor a join without an actor: it would take the live member's token
  auto bare = f.join(1);
  REQUIRE_FALSE(bare);
  CHECK(is(bare.error(), af_error::already_exists));
  CHECK(f.tokens[1] == token);
  // the refused process ends: it says done for index 1 without the token
  for (const auto& t : {std::string{}, std::string(16, 'x')}) {
    caf::expected<uint32_t> r{make_error(af_error::internal, "no reply")};
    f.self->request(f.agg, 10s, done_atom::value, uint32_t{1}, t, std::string{"refused"})
      .receive([&](uint32_t n) { r = n; }, [&](caf::error& e) { r = std::move(e); });
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::invalid_argument));
  }
  auto s = f.stats();
  CHECK(s.workers[1].status == "member");
  CHECK(s.workers[1].error.empty());
  CHECK(s.active == 2);
  // the live member pushes on, and the round waits for it as before
  auto p0 = f.push(0, 0, aggregator_fixture::values(1, 1));
  REQUIRE(f.push_now(1, 0, aggregator_fixture::values(3, 3)));
  REQUIRE(aggregator_fixture::reply(p0));
  // the same actor joining again (after a switch) keeps its token
  REQUIRE(f.join(1, live.actor));
  CHECK(f.tokens[1] == token);
}

TEST_CASE("a member's done says why it failed, and its stats show it until it joins again",
          "[aggregator][members]") {
  // Catches: a worker that failed counted as done like one that finished
  // (the chief reported success for a job whose worker exited 1).
  aggregator_fixture f;
  f.spawn("sync", 2, true, sgd);
  worker_stand_in w1{f.sys};
  REQUIRE(f.join(0));
  REQUIRE(f.join(1, w1.actor));
  caf::expected<uint32_t> r{make_error(af_error::internal, "no reply")};
  f.self
    ->request(f.agg, 10s, done_atom::value, uint32_t{1}, f.tokens[1],
              std::string{"worker 1 at local step 3: pushed step 3 twice"})
    .receive([&](uint32_t n) { r = n; }, [&](caf::error& e) { r = std::move(e); });
  REQUIRE(r);
  auto s = f.stats();
  CHECK(s.workers[1].status == "done");
  CHECK_THAT(s.workers[1].error, Catch::Contains("pushed step 3 twice"));
  CHECK(s.workers[0].error.empty());
  CHECK_FALSE(event_with(s, {"worker 1", "failed", "pushed step 3 twice"}).empty());
  // a worker that failed before it joined (no token) is taken too: no
  // process joined under its index
  aggregator_fixture g;
  g.spawn("sync", 2, true, sgd);
  caf::expected<uint32_t> early{make_error(af_error::internal, "no reply")};
  g.self
    ->request(g.agg, 10s, done_atom::value, uint32_t{1}, std::string{},
              std::string{"worker 1: loading the data: no such file"})
    .receive([&](uint32_t n) { early = n; }, [&](caf::error& e) { early = std::move(e); });
  REQUIRE(early);
  CHECK_THAT(g.stats().workers[1].error, Catch::Contains("no such file"));
  CHECK(g.stats().active == 1);
  // a new process of that index clears it
  caf::anon_send_exit(w1.actor, caf::exit_reason::kill);
  worker_stand_in again{f.sys};
  REQUIRE(f.join(1, again.actor));
  CHECK(f.stats().workers[1].error.empty());
}

TEST_CASE("an async push retried after its ps was restored from a checkpoint that holds it "
          "counts once",
          "[aggregator][members][exactly-once]") {
  // Catches: a push applied and checkpointed, whose answer was lost with its
  // ps, applied again when the worker retried it at the restored ps.
  aggregator_fixture f;
  f.spawn("async", 1, true, sgd);
  REQUIRE(f.join(0));
  auto push_seq = [&](aggregator_fixture& at, uint64_t seq, float g) {
    caf::expected<std::pair<uint64_t, tensor>> out{make_error(af_error::internal, "no reply")};
    at.self
      ->request(at.agg, 10s, push_atom::value, uint32_t{0}, uint64_t{0},
                push_credentials{at.tokens[0], seq, "test"}, aggregator_fixture::values(g, g))
      .receive([&](uint64_t s, tensor& p, bool) { out = std::make_pair(s, std::move(p)); },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  };
  REQUIRE(push_seq(f, 1, 2)); // w: 1 - 0.5 * 2 = 0
  CHECK(f.value(0) == filled(4, 0));
  // the checkpoint
  caf::expected<aggregator_state> saved{make_error(af_error::internal, "no reply")};
  f.self->request(f.agg, 10s, save_atom::value)
    .receive([&](aggregator_state& st) { saved = std::move(st); },
             [&](caf::error& e) { saved = std::move(e); });
  REQUIRE(saved);
  REQUIRE(saved->seq_workers == std::vector<uint32_t>{0});
  REQUIRE(saved->seq_taken == std::vector<uint64_t>{1});
  // the ps dies; a new one is restored from the checkpoint
  aggregator_fixture g;
  g.spawn("async", 1, true, sgd);
  REQUIRE(ask(g, restore_atom::value, *saved));
  CHECK(g.value(0) == filled(4, 0));
  // the worker joins it again (told the last push it took) and retries push 1
  caf::expected<uint64_t> last{make_error(af_error::internal, "no reply")};
  g.self
    ->request(g.agg, 10s, join_atom::value, uint32_t{0}, std::string{"/job:worker/task:0"},
              std::string{}, uint32_t{1}, caf::actor{})
    .receive(
      [&](uint64_t, std::string& t, uint64_t q) {
        g.tokens[0] = std::move(t);
        last = q;
      },
      [&](caf::error& e) { last = std::move(e); });
  REQUIRE(last);
  CHECK(*last == 1);
  auto retried = push_seq(g, 1, 2);
  REQUIRE(retried);
  CHECK(g.value(0) == filled(4, 0)); // not applied again (it would be -1)
  CHECK(g.stats().applied == 0);
  // its next push is applied
  REQUIRE(push_seq(g, 2, 2));
  CHECK(g.value(0) == filled(4, -1));
}

// -- the gradient-norm guard -------------------------------------------------------

TEST_CASE("the norm guard scales down a gradient far over the recent median, after its warm-up",
          "[aggregator][guard]") {
  // Catches: a guard that acts before it knows the scale, clips within the
  // limit, or whose median never follows gradients that really grow.
  norm_guard off;
  CHECK(off.admit(1e30) == 1);
  norm_guard g{10};
  for (size_t i = 0; i < norm_guard::warm_up; ++i)
    CHECK(g.admit(i == 0 ? 1e6 : 2.0) == 1); // warming up: even the first outlier passes
  CHECK(g.median() == 2.0);
  CHECK(g.admit(20.0) == 1);                    // exactly at the bound
  CHECK(g.admit(2e30) == Approx(20.0 / 2e30));  // scaled to 10 x median
  // gradients that grow 100x for good: the median follows within a window
  double last = 0;
  for (int i = 0; i < 64; ++i)
    last = g.admit(200.0);
  CHECK(last == 1);
}

TEST_CASE("with grad_norm_guard, one push 10^30 times the others moves the model no more than "
          "the guard allows, and is counted on its worker",
          "[aggregator][guard]") {
  // Catches: the guard not applied to async pushes (or to sync rounds),
  // and its count not shown.
  for (std::string mode : {"async", "sync"}) {
    INFO(mode);
    aggregator_fixture f;
    f.spawn(mode, 1, true, [](aggregator_spec& s) {
      sgd(s);
      s.optimizer.lr = 0.001f;
      s.grad_norm_guard = 10;
    });
    uint64_t step = 0;
    for (size_t i = 0; i < norm_guard::warm_up; ++i) {
      auto r = f.push_now(0, step, aggregator_fixture::values(1, 1));
      REQUIRE(r);
      step = r->first;
    }
    auto before = f.value(0);
    auto r = f.push_now(0, step, aggregator_fixture::values(1e30f, 1e30f));
    REQUIRE(r);
    auto after = f.value(0);
    // 10 x the median norm, spread evenly over the 7 elements: each moves by
    // lr x 10 x 1 = 0.01 (unguarded: 10^27)
    CHECK(std::abs(after[0] - before[0]) == Approx(0.01).epsilon(1e-3));
    auto s = f.stats();
    CHECK(s.workers[0].guarded == 1);
  }
}
