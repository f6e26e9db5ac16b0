// A dense push taken on the data plane's thread (dist/aggregator_plane.cpp,
// plane_push_paths::dense): sync rounds whose members all push over the data
// plane are released on its threads, and give the bits of the same rounds
// pushed through the aggregator's actor; what is not the common case (a
// retry) still goes to the actor.
#include <catch2/catch.hpp>

#include <chrono>
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

using namespace af;
using namespace std::chrono_literals;

using test::same_bytes;

namespace {

constexpr int64_t floats = 50000; // w and b together

tensor gradient(uint32_t w, int k) {
  return test::dense_gradient(floats, w, k);
}

/// Two twin aggregators of one ps (w and b each, momentum): "plane" takes
/// its members' pushes over the data plane, "caf" through its actor.
struct twins {
  explicit twins(const std::string& mode) {
    auto c = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
    REQUIRE(c);
    cluster = std::move(*c);
    auto s = cluster->session_for("worker", 0);
    REQUIRE(s);
    sess = std::make_unique<session>(std::move(*s));
    {
      auto scope = sess->device("/job:ps/task:0");
      for (const auto* side : {"plane", "caf"}) {
        REQUIRE(sess->variable(std::string{"w_"} + side, {floats - 1}, initializer::constant(1)));
        REQUIRE(sess->variable(std::string{"b_"} + side, {1}, initializer::constant(0.5)));
      }
    }
    REQUIRE_FALSE(sess->initialize());
    self = std::make_unique<caf::scoped_actor>(sess->system());
    for (const auto* side : {"plane", "caf"}) {
      aggregator_spec spec;
      spec.name = std::string{"test/dense_"} + side;
      spec.mode = mode;
      spec.variables = {std::string{"w_"} + side, std::string{"b_"} + side};
      spec.workers = 2;
      spec.optimizer.kind = "momentum";
      spec.optimizer.lr = 0.05;
      spec.optimizer.momentum = 0.9;
      spec.step_timeout_ms = 60000;
      auto a = sess->aggregator("ps", 0, spec);
      REQUIRE(a);
      names.push_back(spec.name);
      aggs.push_back(*a);
      tokens.push_back({test::join_for_token(*self, *a, 0), test::join_for_token(*self, *a, 1)});
    }
    auto info = sess->ping("ps", 0);
    REQUIRE(info);
    for (int w = 0; w < 2; ++w) {
      auto ch = data_channel::connect("127.0.0.1", info->data_port, "/job:ps/task:0", 5s);
      REQUIRE(ch);
      chans.push_back(std::move(*ch));
    }
  }

  aggregator_stats stats(size_t side) {
    aggregator_stats out;
    (*self)
      ->request(aggs[side], 10s, stats_atom::value)
      .receive([&](aggregator_stats& s) { out = std::move(s); },
               [&](caf::error& e) { FAIL(describe(e)); });
    return out;
  }

  /// Worker `w`'s push of round `k` to the plane twin, over its connection.
  caf::expected<std::pair<uint64_t, tensor>> push_plane(uint32_t w, int k, uint64_t seq) {
    return chans[w]->aggregate(wire::kind::push, names[0], w, static_cast<uint64_t>(k - 1),
                               {gradient(w, k)}, 30s, tokens[0][w], seq);
  }

  /// The same push to the caf twin, through its actor (the flat answer).
  caf::expected<std::pair<uint64_t, tensor>> push_caf(caf::scoped_actor& from, uint32_t w, int k) {
    caf::expected<std::pair<uint64_t, tensor>> out{make_error(af_error::internal, "no answer")};
    from
      ->request(aggs[1], 30s, push_atom::value, w, static_cast<uint64_t>(k - 1),
                push_credentials{tokens[1][w], static_cast<uint64_t>(k), "test"},
                std::vector<tensor>{gradient(w, k)})
      .receive([&](uint64_t step, tensor& p, bool) { out = std::make_pair(step, std::move(p)); },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  std::unique_ptr<embedded_cluster> cluster;
  std::unique_ptr<session> sess;
  std::unique_ptr<caf::scoped_actor> self;
  std::vector<std::string> names;
  std::vector<aggregator_actor> aggs;
  std::vector<std::vector<std::string>> tokens;
  std::vector<std::unique_ptr<data_channel>> chans;
};

} // namespace

TEST_CASE("dense sync rounds whose every push comes over the data plane are taken on its "
          "threads, and answer the bits of the same rounds through the actor",
          "[plane][members][dense_plane]") {
  // Catches: a dense plane path that is never taken (every push through the
  // actor would pass the bit checks), a release on one plane thread that
  // does not wake the other (it would time out), and an answer from the
  // plane's path that is not the round's parameters (momentum, 2 members).
  twins t("sync");
  constexpr int rounds = 30;
  std::vector<std::pair<uint64_t, tensor>> second(rounds);
  std::string failure;
  std::thread other([&] {
    for (int k = 1; k <= rounds; ++k) {
      auto r = t.push_plane(1, k, static_cast<uint64_t>(k));
      if (!r) {
        failure = describe(r.error());
        return;
      }
      second[k - 1] = std::move(*r);
    }
  });
  std::vector<std::pair<uint64_t, tensor>> first;
  for (int k = 1; k <= rounds && failure.empty(); ++k) {
    auto r = t.push_plane(0, k, static_cast<uint64_t>(k));
    INFO((r ? std::string{} : describe(r.error())));
    REQUIRE(r);
    first.push_back(std::move(*r));
  }
  other.join();
  INFO(failure);
  REQUIRE(failure.empty());
  // The caf twin: its two members' pushes of a round from two threads.
  caf::scoped_actor a{t.sess->system()}, b{t.sess->system()};
  for (int k = 1; k <= rounds; ++k) {
    INFO("round " << k);
    caf::expected<std::pair<uint64_t, tensor>> rb{make_error(af_error::internal, "not run")};
    std::thread pusher([&] { rb = t.push_caf(b, 1, k); });
    auto ra = t.push_caf(a, 0, k);
    pusher.join();
    REQUIRE(ra);
    REQUIRE(rb);
    CHECK(first[k - 1].first == static_cast<uint64_t>(k));
    CHECK(second[k - 1].first == static_cast<uint64_t>(k));
    CHECK(ra->first == static_cast<uint64_t>(k));
    CHECK(same_bytes(first[k - 1].second, ra->second));
    CHECK(same_bytes(second[k - 1].second, ra->second));
    CHECK(same_bytes(rb->second, ra->second));
    if (k > 1) // each round's answer is its own
      CHECK_FALSE(same_bytes(first[k - 2].second, first[k - 1].second));
  }
  auto plane = t.stats(0), caf_side = t.stats(1);
  CHECK(plane.global_step == rounds);
  CHECK(plane.applied == rounds);
  CHECK(plane.pushes_on_plane == 2 * rounds);
  CHECK(caf_side.global_step == rounds);
  CHECK(caf_side.pushes_on_plane == 0);
}

TEST_CASE("dense async pushes over the data plane are applied on its thread, each once, and a "
          "retried push number goes to the actor, which answers without applying it again",
          "[plane][members][dense_plane]") {
  // Catches: an async plane path applying a retry again (the push number
  // check skipped), answering a stale or flat-less answer, or never taken.
  twins t("async");
  constexpr int pushes = 20;
  caf::scoped_actor a{t.sess->system()};
  for (int k = 1; k <= pushes; ++k) {
    INFO("push " << k);
    auto r = t.push_plane(0, k, static_cast<uint64_t>(k));
    REQUIRE(r);
    auto c = t.push_caf(a, 0, k);
    REQUIRE(c);
    CHECK(r->first == static_cast<uint64_t>(k));
    CHECK(c->first == static_cast<uint64_t>(k));
    CHECK(same_bytes(r->second, c->second));
  }
  // Push number `pushes` again: already taken, answered with the parameters.
  auto again = t.push_plane(0, pushes, static_cast<uint64_t>(pushes));
  REQUIRE(again);
  CHECK(again->first == static_cast<uint64_t>(pushes));
  auto read = t.chans[0]->aggregate(wire::kind::pull, t.names[0], 0, 0, {}, 10s);
  REQUIRE(read);
  CHECK(same_bytes(again->second, read->second));
  auto s = t.stats(0);
  CHECK(s.applied == pushes);
  CHECK(s.global_step == pushes);
  CHECK(s.pushes_on_plane == pushes); // the retry went to the actor
}
