// A dense push taken on the data plane's thread (dist/aggregator_plane.cpp)
// where what else happens to the aggregator meets it: a switch, the step
// timeout, a restore, a member's done, a push through the actor in the same
// round, a late push, a refused value, a plane wait that timed out. Each
// was the actor's alone before the dense plane path; the answers must be
// what the actor gave.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "caf/all.hpp"

#include "core/wire_format.hpp"
#include "dist/embedded_cluster.hpp"
#include "dist/training.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "dense_pushes.hpp"
#include "members.hpp"
#include "wait.hpp"

using namespace af;
using namespace std::chrono_literals;

using test::same_bytes;

namespace {

constexpr int64_t floats = 20000;

tensor gradient(uint32_t w, int k) {
  return test::dense_gradient(floats, w, k);
}

/// One ps with w and b (momentum) under aggregator "test/edge" of `mode`
/// for two members (joined without actors: none is put on standby by a
/// switch), each with its own data-plane connection.
struct rig {
  rig(const std::string& mode, uint32_t timeout_ms) {
    auto c = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
    REQUIRE(c);
    cluster = std::move(*c);
    auto s = cluster->session_for("worker", 0);
    REQUIRE(s);
    sess = std::make_unique<session>(std::move(*s));
    {
      auto scope = sess->device("/job:ps/task:0");
      REQUIRE(sess->variable("w", {floats - 1}, initializer::constant(1)));
      REQUIRE(sess->variable("b", {1}, initializer::constant(0.5)));
    }
    REQUIRE_FALSE(sess->initialize());
    self = std::make_unique<caf::scoped_actor>(sess->system());
    spec.name = "test/edge";
    spec.mode = mode;
    spec.variables = {"w", "b"};
    spec.workers = 2;
    spec.optimizer.kind = "momentum";
    spec.optimizer.lr = 0.05;
    spec.optimizer.momentum = 0.9;
    spec.step_timeout_ms = timeout_ms;
    auto a = sess->aggregator("ps", 0, spec);
    REQUIRE(a);
    agg = *a;
    tokens = {test::join_for_token(*self, agg, 0), test::join_for_token(*self, agg, 1)};
    auto info = sess->ping("ps", 0);
    REQUIRE(info);
    for (int w = 0; w < 2; ++w) {
      auto ch = data_channel::connect("127.0.0.1", info->data_port, "/job:ps/task:0", 5s);
      REQUIRE(ch);
      chans.push_back(std::move(*ch));
    }
  }

  aggregator_stats stats() {
    aggregator_stats out;
    (*self)->request(agg, 10s, stats_atom::value).receive(
      [&](aggregator_stats& s) { out = std::move(s); }, [&](caf::error& e) { FAIL(describe(e)); });
    return out;
  }

  caf::expected<std::pair<uint64_t, tensor>> push(uint32_t w, uint64_t step, tensor g,
                                                  uint64_t seq,
                                                  std::chrono::milliseconds wait = 30s) {
    std::vector<tensor> parts;
    if (!g.empty())
      parts.push_back(std::move(g));
    return chans[w]->aggregate(wire::kind::push, spec.name, w, step, parts, wait, tokens[w], seq);
  }

  tensor pull() {
    auto r = chans[0]->aggregate(wire::kind::pull, spec.name, 0, 0, {}, 10s);
    REQUIRE(r);
    return r->second;
  }

  aggregator_spec spec;
  std::unique_ptr<embedded_cluster> cluster;
  std::unique_ptr<session> sess;
  std::unique_ptr<caf::scoped_actor> self;
  aggregator_actor agg;
  std::vector<std::string> tokens;
  std::vector<std::unique_ptr<data_channel>> chans;
};

} // namespace

TEST_CASE("a dense sync push parked on the data plane is answered by a switch to async, and the "
          "next push is applied on the plane",
          "[plane][members][dense_plane]") {
  rig r("sync", 60000);
  caf::expected<std::pair<uint64_t, tensor>> got{make_error(af_error::internal, "none")};
  std::thread t([&] { got = r.push(0, 0, gradient(0, 1), 1); });
  // wait until parked
  REQUIRE(eventually([&] { return r.stats().pushes_on_plane >= 1; })); // parked
  auto want = r.spec;
  want.mode = "async";
  (*r.self)->request(r.agg, 10s, switch_atom::value, want).receive(
    [](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  t.join();
  INFO((got ? std::string{} : describe(got.error())));
  REQUIRE(got);
  CHECK(got->first == 1);
  CHECK(same_bytes(got->second, r.pull()));
  // async now, on the plane
  auto n = r.push(1, 1, gradient(1, 2), 1);
  REQUIRE(n);
  CHECK(n->first == 2);
  CHECK(same_bytes(n->second, r.pull()));
  CHECK(r.stats().pushes_on_plane == 2);
}

TEST_CASE("a dense sync push parked on the data plane hears the aggregator's step timeout, and "
          "its next push joins the next round",
          "[plane][members][dense_plane]") {
  rig r("sync", 300);
  auto first = r.push(0, 0, gradient(0, 1), 1);
  REQUIRE_FALSE(first);
  INFO(describe(first.error()));
  CHECK(describe(first.error()).find("abandoned") != std::string::npos);
  caf::expected<std::pair<uint64_t, tensor>> other{make_error(af_error::internal, "none")};
  std::thread t([&] { other = r.push(1, 0, gradient(1, 1), 1); });
  auto again = r.push(0, 0, gradient(0, 1), 2);
  t.join();
  REQUIRE(again);
  REQUIRE(other);
  CHECK(again->first == 1);
  CHECK(same_bytes(again->second, other->second));
  CHECK(same_bytes(again->second, r.pull()));
  auto s = r.stats();
  CHECK(s.pushes_on_plane == 3);
  CHECK(s.applied == 1);
}

TEST_CASE("a restore aborts a dense sync push parked on the data plane, naming the restore",
          "[plane][members][dense_plane]") {
  rig r("sync", 60000);
  caf::expected<std::pair<uint64_t, tensor>> got{make_error(af_error::internal, "none")};
  std::thread t([&] { got = r.push(0, 0, gradient(0, 1), 1); });
  REQUIRE(eventually([&] { return r.stats().pushes_on_plane >= 1; })); // parked
  aggregator_state in;
  in.global_step = 7;
  (*r.self)->request(r.agg, 10s, restore_atom::value, in).receive(
    [](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  t.join();
  REQUIRE_FALSE(got);
  CHECK(describe(got.error()).find("restored") != std::string::npos);
}

TEST_CASE("a dense sync round with a push parked on the data plane and one through the actor "
          "answers both with the round's parameters",
          "[plane][members][dense_plane]") {
  rig r("sync", 60000);
  caf::expected<std::pair<uint64_t, tensor>> got{make_error(af_error::internal, "none")};
  std::thread t([&] { got = r.push(0, 0, gradient(0, 1), 1); });
  REQUIRE(eventually([&] { return r.stats().pushes_on_plane >= 1; })); // parked
  caf::scoped_actor a{r.sess->system()};
  tensor flat;
  a->request(r.agg, 30s, push_atom::value, uint32_t{1}, uint64_t{0},
             push_credentials{r.tokens[1], 1, "test"}, std::vector<tensor>{gradient(1, 1)})
    .receive([&](uint64_t step, tensor& p, bool) { CHECK(step == 1); flat = p; },
             [&](caf::error& e) { FAIL(describe(e)); });
  t.join();
  REQUIRE(got);
  CHECK(same_bytes(got->second, flat));
  CHECK(same_bytes(flat, r.pull()));
}

TEST_CASE("an async dense push with a non-finite float is refused on the data plane, and the same "
          "push number with finite values is applied once",
          "[plane][members][dense_plane]") {
  rig r("async", 60000);
  auto g = gradient(0, 1);
  g.mutable_data<float>()[floats - 3] = std::nanf("");
  auto bad = r.push(0, 0, g, 1);
  REQUIRE_FALSE(bad);
  INFO(describe(bad.error()));
  auto good = r.push(0, 0, gradient(0, 1), 1);
  REQUIRE(good);
  CHECK(good->first == 1);
  auto s = r.stats();
  CHECK(s.refused == 1);
  CHECK(s.applied == 1);
  CHECK(s.pushes == 2);
}

TEST_CASE("a data-plane thread whose dense sync push timed out is answered right at its next "
          "push (its answer parts stayed with the round)",
          "[plane][members][dense_plane]") {
  // The node's plane waits step_timeout_ms + 2 s as the aggregator was
  // spawned (2.2 s); switched back into sync with a longer step timeout,
  // the aggregator does not abandon the round first, so the plane's wait
  // times out and leaves its ticket (and its answer parts) in the round.
  rig r("sync", 200);
  auto want = r.spec;
  want.mode = "async";
  (*r.self)->request(r.agg, 10s, switch_atom::value, want).receive(
    [](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  want.mode = "sync";
  want.step_timeout_ms = 60000;
  (*r.self)->request(r.agg, 10s, switch_atom::value, want).receive(
    [](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  auto first = r.push(0, 0, gradient(0, 1), 1);
  REQUIRE_FALSE(first);
  INFO(describe(first.error()));
  auto other = r.push(1, 0, gradient(1, 1), 1); // completes the round with 0's push
  REQUIRE(other);
  CHECK(other->first == 1);
  // 0's next round, on the same thread
  caf::expected<std::pair<uint64_t, tensor>> o2{make_error(af_error::internal, "none")};
  std::thread t([&] { o2 = r.push(1, 1, gradient(1, 2), 2); });
  auto again = r.push(0, 1, gradient(0, 2), 2);
  t.join();
  REQUIRE(again);
  REQUIRE(o2);
  CHECK(again->first == 2);
  CHECK(same_bytes(again->second, o2->second));
  CHECK(same_bytes(again->second, r.pull()));
}

TEST_CASE("with replicas_to_aggregate 1 the first dense push releases its round on the plane, and "
          "the other is dropped as late by the actor",
          "[plane][members][dense_plane]") {
  rig r("sync", 60000);
  auto want = r.spec;
  want.replicas_to_aggregate = 1;
  (*r.self)->request(r.agg, 10s, switch_atom::value, want).receive(
    [](uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  auto a = r.push(0, 0, gradient(0, 1), 1);
  REQUIRE(a);
  CHECK(a->first == 1);
  bool late = false;
  std::vector<tensor> parts{gradient(1, 1)};
  auto b = r.chans[1]->aggregate(wire::kind::push, r.spec.name, 1, 0, parts, 10s, r.tokens[1], 1,
                                 &late);
  REQUIRE(b);
  CHECK(late);
  CHECK(b->first == 1);
  CHECK(same_bytes(b->second, r.pull()));
  CHECK(same_bytes(a->second, r.pull()));
  auto s = r.stats();
  CHECK(s.dropped_stale == 1);
  CHECK(s.pushes_on_plane == 1);
}

TEST_CASE("a member's done releases a dense sync round parked on the data plane",
          "[plane][members][dense_plane]") {
  rig r("sync", 60000);
  caf::expected<std::pair<uint64_t, tensor>> got{make_error(af_error::internal, "none")};
  std::thread t([&] { got = r.push(0, 0, gradient(0, 1), 1); });
  REQUIRE(eventually([&] { return r.stats().pushes_on_plane >= 1; })); // parked
  (*r.self)->request(r.agg, 10s, done_atom::value, uint32_t{1}, r.tokens[1], std::string{})
    .receive([](uint32_t) {}, [](caf::error& e) { FAIL(describe(e)); });
  t.join();
  REQUIRE(got);
  CHECK(got->first == 1);
  CHECK(same_bytes(got->second, r.pull()));
  // alone now: its next push releases at once, on the plane
  auto n = r.push(0, 1, gradient(0, 2), 2);
  REQUIRE(n);
  CHECK(n->first == 2);
  CHECK(same_bytes(n->second, r.pull()));
}

TEST_CASE("a dense sync push refused as non-finite on the data plane is followed by an abstention "
          "that joins the round",
          "[plane][members][dense_plane]") {
  rig r("sync", 60000);
  auto g = gradient(0, 1);
  g.mutable_data<float>()[5] = INFINITY;
  auto bad = r.push(0, 0, g, 1);
  REQUIRE_FALSE(bad);
  caf::expected<std::pair<uint64_t, tensor>> got{make_error(af_error::internal, "none")};
  std::thread t([&] { got = r.push(0, 0, tensor{}, 1); });
  auto other = r.push(1, 0, gradient(1, 1), 1);
  t.join();
  REQUIRE(got);
  REQUIRE(other);
  CHECK(got->first == 1);
  CHECK(same_bytes(got->second, other->second));
  auto s = r.stats();
  CHECK(s.pushes == 3);
  CHECK(s.applied == 1);
}
