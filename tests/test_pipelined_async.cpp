// Pipelined async pushes end to end (issue 24, section 3, "the same for
// async, per push"): streamed pushes (wire::kind::push_streamed) over a TCP
// data plane into an async aggregator on an embedded cluster, each applied
// chunk by chunk as it arrives, against a twin aggregator fed the same
// pushes store-and-forward in the same order; pushes aborted half way; and
// two workers streaming at once. Plain TCP only: not tagged [plane] (see
// test_pipelined_push.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/wire_format.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "pipelined_bed.hpp"
#include "wait.hpp"

using namespace af;
using namespace af::test;
using namespace std::chrono_literals;

namespace {

/// `worker`'s push to `t`: streamed, or store-and-forward.
push_result push_one(twin& t, uint32_t worker, uint64_t step, const tensor& g, uint64_t seq,
                     bool streamed) {
  return streamed ? t.chans[worker]->push_streamed(t.name, worker, step, {g}, 20s,
                                                   t.tokens[worker], seq)
                  : t.chans[worker]->aggregate(wire::kind::push, t.name, worker, step, {g}, 20s,
                                               t.tokens[worker], seq);
}

} // namespace

TEST_CASE("pipelined async pushes over TCP give the store-and-forward pushes' answers, values "
          "and slots bit for bit, sgd, momentum and adam",
          "[pipeline][members]") {
  // Catches: an async push's chunk applied at the wrong global step (adam's
  // bias correction shows it), from a stale snapshot of the variables or
  // slots, or answered before it was applied; bookkeeping that differs from
  // apply_now's (the global step, applied, staleness); and streamed async
  // pushes that silently went store-and-forward (pushes_on_plane stays 0).
  const auto kind = GENERATE(std::string{"sgd"}, std::string{"momentum"}, std::string{"adam"});
  CAPTURE(kind);
  const size_t n = 300000; // the 1 M job's shape, scaled down: w [n] and b [1]
  bed b;
  auto sf = b.make("asf", n, 2, kind, "async");
  auto pl = b.make("apl", n, 2, kind, "async");
  std::vector<uint64_t> last(2, 0); // each worker's step: its last answer's global step
  for (int k = 0; k < 3; ++k) {
    for (uint32_t w = 0; w < 2; ++w) {
      INFO("push " << k << " of worker " << w);
      auto g = gradient(n + 1, static_cast<uint32_t>(100 * k + 7 * w + 1));
      auto seq = static_cast<uint64_t>(k + 1);
      auto want = push_one(sf, w, last[w], g, seq, false);
      auto got = push_one(pl, w, last[w], g, seq, true);
      check_same(got, want);
      last[w] = got->first;
      check_same_state(b, pl, sf);
    }
  }
  auto a = b.stats(sf), c = b.stats(pl);
  CHECK(c.pushes_on_plane == 6);
  CHECK(c.applied == 6);
  CHECK(c.applied == a.applied);
  CHECK(c.staleness == a.staleness);
}

TEST_CASE("a pipelined async push aborted by a NaN in a late chunk or a worker that hangs up half "
          "way changes no value or slot, and the push behind it is applied",
          "[pipeline][members]") {
  // Catches: a push whose early chunks reached the variables before it was
  // aborted (a half-updated model), an abort that leaves the push in line
  // (the push behind it waits for its timeout), and a refusal that does
  // not name the variable and element.
  const bool nan = GENERATE(true, false);
  CAPTURE(nan);
  const size_t n = 300000;
  bed b;
  auto sf = b.make("absf", n, 2, "momentum", "async");
  auto pl = b.make("abpl", n, 2, "momentum", "async");
  auto g0 = gradient(n + 1, 1), g1 = gradient(n + 1, 2);
  check_same(push_one(pl, 0, 0, g0, 1, true), push_one(sf, 0, 0, g0, 1, false)); // slots made
  auto before = b.saved(pl);
  push_result behind{make_error(af_error::internal, "")};
  if (nan) {
    auto g = gradient(n + 1, 3);
    g.mutable_data<float>()[n - 10] = std::numeric_limits<float>::quiet_NaN(); // the last chunk
    auto r = push_one(pl, 0, 1, g, 2, true);
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::non_finite));
    CHECK_THAT(describe(r.error()), Catch::Contains("'w_abpl' element 299990"));
    CHECK_THAT(describe(r.error()), Catch::Contains("the push is abandoned and no variable changed"));
    CHECK_THAT(b.stats(pl).last_refusal, Catch::Contains("not finite"));
    behind = push_one(pl, 1, 0, g1, 1, true);
  } else {
    // Worker 0 by hand: half its push, then worker 1's push joins the line
    // behind it (read whole meanwhile), then worker 0 hangs up.
    auto pushes = b.stats(pl).pushes;
    std::optional<raw_peer> p{std::in_place, b.port};
    auto g = gradient(n + 1, 3);
    p->send_streamed_head(pl.name, pl.tokens[0], 0, 1, 2, n + 1);
    p->send_all(g.bytes(), g.nbytes() / 2);
    REQUIRE(eventually([&] { return b.stats(pl).pushes > pushes; }));
    std::thread t1{[&] { behind = push_one(pl, 1, 0, g1, 1, true); }};
    bool queued = eventually([&] { return b.stats(pl).pushes > pushes + 1; });
    p.reset();
    t1.join();
    REQUIRE(queued);
  }
  auto want = push_one(sf, 1, 0, g1, 1, false);
  check_same(behind, want);
  CHECK(behind->first == 2);
  check_same_state(b, pl, sf);
  // The push that was refused changed nothing: one commit since `before`.
  CHECK(b.saved(pl).second == before.second + 1);
}

TEST_CASE("a pipelined async push waits its turn behind another no longer than the step timeout, "
          "naming the push it waited for",
          "[pipeline][members]") {
  // Catches: a push behind one that stalls (its worker stopped sending
  // without hanging up) that waits forever or fails without saying what it
  // waited for, and a timed-out push that reached the variables.
  const size_t n = 300000;
  bed b;
  auto pl = b.make("ato", n, 2, "sgd", "async", 1000);
  auto before = b.saved(pl);
  auto pushes = b.stats(pl).pushes;
  raw_peer p{b.port};
  auto g = gradient(n + 1, 3);
  p.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p.send_all(g.bytes(), g.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes > pushes; }));
  auto r = push_one(pl, 1, 0, gradient(n + 1, 4), 1, true);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::timeout));
  CHECK_THAT(describe(r.error()),
             Catch::Contains("for its turn behind the streamed push of worker 0 ("));
  CHECK_THAT(describe(r.error()), Catch::Contains("of 300001 floats)"));
  CHECK_THAT(describe(r.error()), Catch::Contains("no variable changed"));
  check_same_saved(b.saved(pl), before);
}

TEST_CASE("two workers streaming async pushes at once to one aggregator both complete, and the "
          "result is their pushes applied in the order the ps committed them",
          "[pipeline][members]") {
  // Catches: two pushes applied over each other (the second's snapshot
  // taken before the first committed: the first's update lost), a second
  // push that cannot start once the first commits, and answers that are
  // not the parameters of their place in the order.
  const size_t n = 300000;
  bed b;
  auto sf = b.make("ccsf", n, 2, "adam", "async");
  auto pl = b.make("ccpl", n, 2, "adam", "async");
  // First, an overlap made sure of: worker 0 (by hand) sends half its push,
  // worker 1's whole push arrives, then the rest of worker 0's.
  auto g0 = gradient(n + 1, 10), g1 = gradient(n + 1, 11);
  auto pushes = b.stats(pl).pushes;
  raw_peer p{b.port};
  p.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p.send_all(g0.bytes(), g0.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes > pushes; }));
  push_result second{make_error(af_error::internal, "")};
  std::thread t1{[&] { second = push_one(pl, 1, 0, g1, 1, true); }};
  bool queued = eventually([&] { return b.stats(pl).pushes > pushes + 1; });
  p.send_all(g0.bytes() + g0.nbytes() / 2, g0.nbytes() - g0.nbytes() / 2);
  wire::header head, trailer;
  tensor first{dtype::float32, {static_cast<int64_t>(n + 1)}};
  bool read = p.recv_all(&head, sizeof(head)) && head.status == 0
              && p.recv_all(first.mutable_bytes(), first.nbytes())
              && p.recv_all(&trailer, sizeof(trailer));
  t1.join();
  REQUIRE(queued);
  REQUIRE(read);
  CHECK(trailer.status == 0);
  CHECK(trailer.version == 1);
  check_same(push_result{std::make_pair(uint64_t{1}, first)}, push_one(sf, 0, 0, g0, 1, false));
  check_same(second, push_one(sf, 1, 0, g1, 1, false));
  CHECK(second->first == 2);
  check_same_state(b, pl, sf);
  // Then free running: both workers push three times each at once, each
  // from its last answer's step; the answers' global steps give the order.
  struct taken {
    uint32_t worker;
    uint64_t step, seq;
    uint32_t seed;
    push_result answer;
  };
  std::vector<std::vector<taken>> by_worker(2);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      uint64_t step = w == 0 ? 1 : 2;
      for (uint64_t k = 0; k < 3; ++k) {
        auto seed = static_cast<uint32_t>(20 + 10 * w + k);
        auto r = push_one(pl, w, step, gradient(n + 1, seed), k + 2, true);
        by_worker[w].push_back({w, step, k + 2, seed, r});
        if (!r)
          return;
        step = r->first;
      }
    });
  for (auto& t : threads)
    t.join();
  std::vector<taken> all;
  for (auto& v : by_worker)
    for (auto& x : v) {
      REQUIRE(x.answer);
      all.push_back(std::move(x));
    }
  std::sort(all.begin(), all.end(),
            [](const taken& a, const taken& c) { return a.answer->first < c.answer->first; });
  REQUIRE(all.size() == 6);
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& x = all[i];
    INFO("commit " << i << " of worker " << x.worker);
    CHECK(x.answer->first == 3 + i);
    check_same(x.answer, push_one(sf, x.worker, x.step, gradient(n + 1, x.seed), x.seq, false));
  }
  check_same_state(b, pl, sf);
  CHECK(b.stats(pl).pushes_on_plane == 8);
}

TEST_CASE("a live switch out of async abandons the streamed pushes in line, changing no variable, "
          "and their workers hear the new mode",
          "[pipeline][members]") {
  // Catches: a switch that leaves streamed async pushes in line (they would
  // commit later in the new mode, moving the step outside its rounds), or
  // that lets one that started reach the variables half applied.
  const size_t n = 300000;
  bed b;
  auto pl = b.make("asw", n, 2, "momentum", "async");
  auto before = b.saved(pl);
  auto pushes = b.stats(pl).pushes;
  // Worker 0 (by hand) is half way through its push, worker 1's waits behind it.
  raw_peer p{b.port};
  auto g = gradient(n + 1, 3);
  p.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p.send_all(g.bytes(), g.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes > pushes; }));
  push_result behind{make_error(af_error::internal, "")};
  std::thread t1{[&] { behind = push_one(pl, 1, 0, gradient(n + 1, 4), 1, true); }};
  bool queued = eventually([&] { return b.stats(pl).pushes > pushes + 1; });
  aggregator_spec want;
  want.mode = "sync";
  want.variables = {"w_asw", "b_asw"};
  want.workers = 2;
  want.optimizer.kind = "momentum";
  want.optimizer.lr = 0.1;
  want.step_timeout_ms = 20000;
  std::string why;
  (*b.self)->request(pl.agg, 10s, switch_atom::value, want).receive(
    [&](uint64_t) {}, [&](caf::error& e) { why = describe(e); });
  t1.join();
  REQUIRE(queued);
  CHECK(why.empty());
  REQUIRE_FALSE(behind);
  CHECK(is(behind.error(), af_error::mode_changed));
  CHECK_THAT(describe(behind.error()), Catch::Contains("switched from async to sync"));
  // Worker 0's trailer says so too, once the rest of its push is sent.
  p.send_all(g.bytes() + g.nbytes() / 2, g.nbytes() - g.nbytes() / 2);
  wire::header head, trailer;
  tensor zeros{dtype::float32, {static_cast<int64_t>(n + 1)}};
  REQUIRE(p.recv_all(&head, sizeof(head)));
  REQUIRE(p.recv_all(zeros.mutable_bytes(), zeros.nbytes()));
  REQUIRE(p.recv_all(&trailer, sizeof(trailer)));
  CHECK(trailer.status == static_cast<uint8_t>(af_error::mode_changed));
  check_same_saved(b.saved(pl), before);
}

TEST_CASE("while streamed async pushes are in line a store-and-forward push with values is refused "
          "naming pipeline_async, and an abstention is taken",
          "[pipeline][members]") {
  // Catches: a store-and-forward push applied under a streamed push whose
  // answer is partly sent (the streamed push's commit would then be refused
  // as an assign, or install over it), a refusal that does not say what to
  // set, and an abstention (no values) refused with it.
  const size_t n = 300000;
  bed b;
  auto pl = b.make("amx", n, 2, "sgd", "async");
  auto pushes = b.stats(pl).pushes;
  raw_peer p{b.port};
  auto g = gradient(n + 1, 3);
  p.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p.send_all(g.bytes(), g.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes > pushes; }));
  auto plain = push_one(pl, 1, 0, gradient(n + 1, 4), 1, false);
  REQUIRE_FALSE(plain);
  CHECK(is(plain.error(), af_error::invalid_argument));
  CHECK_THAT(describe(plain.error()), Catch::Contains("[train] pipeline_async alike"));
  auto abstain = pl.chans[1]->aggregate(wire::kind::push, pl.name, 1, 0, {}, 20s, pl.tokens[1], 2);
  CHECK(abstain);
  // The streamed push goes on and commits.
  p.send_all(g.bytes() + g.nbytes() / 2, g.nbytes() - g.nbytes() / 2);
  wire::header head, trailer;
  tensor answer{dtype::float32, {static_cast<int64_t>(n + 1)}};
  REQUIRE(p.recv_all(&head, sizeof(head)));
  REQUIRE(p.recv_all(answer.mutable_bytes(), answer.nbytes()));
  REQUIRE(p.recv_all(&trailer, sizeof(trailer)));
  CHECK(trailer.status == 0);
  CHECK(trailer.version == 1);
  CHECK(b.stats(pl).applied == 1);
}
