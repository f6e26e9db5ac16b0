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
#include <optional>
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

TEST_CASE("a pipelined async push abandoned by a NaN or a hang-up is counted as refused, not "
          "as applied, as a store-and-forward push refused is",
          "[pipeline][members]") {
  // Catches: an abandoned streamed push counted as a push and nothing
  // else (pushes no longer applied + refused: the progress line and the
  // summary lose it), or counted as applied.
  const bool nan = GENERATE(true, false);
  CAPTURE(nan);
  const size_t n = 300000;
  bed b;
  auto sf = b.make("acsf", n, 2, "sgd", "async");
  auto pl = b.make("acpl", n, 2, "sgd", "async");
  auto g = gradient(n + 1, 3);
  auto before = b.stats(pl);
  if (nan) {
    g.mutable_data<float>()[n - 10] = std::numeric_limits<float>::quiet_NaN();
    REQUIRE_FALSE(push_one(sf, 0, 0, g, 1, false));
    REQUIRE_FALSE(push_one(pl, 0, 0, g, 1, true));
  } else {
    std::optional<raw_peer> p{std::in_place, b.port};
    p->send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
    p->send_all(g.bytes(), g.nbytes() / 2);
    REQUIRE(eventually([&] { return b.stats(pl).pushes > before.pushes; }));
    p.reset();
  }
  REQUIRE(eventually([&] { return b.stats(pl).refused > before.refused; }));
  auto st = b.stats(pl);
  CHECK(st.pushes == 1);
  CHECK(st.applied == 0);
  CHECK(st.refused == 1);
  REQUIRE(st.workers.size() >= 1);
  CHECK(st.workers[0].pushes == 1);
  CHECK(st.workers[0].applied == 0);
  CHECK(st.workers[0].refused == 1);
  CHECK_THAT(st.last_refusal, Catch::Contains(nan ? "not finite" : "stopped in the middle of"));
  if (nan) { // the same counts as the store-and-forward push's
    auto want = b.stats(sf);
    CHECK(st.pushes == want.pushes);
    CHECK(st.applied == want.applied);
    CHECK(st.refused == want.refused);
    CHECK(st.workers[0].refused == want.workers[0].refused);
  }
  // The next push is applied and counted as any.
  REQUIRE(push_one(pl, 1, 0, gradient(n + 1, 4), 1, true));
  CHECK(b.stats(pl).applied == 1);
}

TEST_CASE("a streamed async push whose sender stalls at the head of the line is refused after a "
          "quarter of the step timeout, naming it and the bound, and the push behind it goes on",
          "[pipeline][members]") {
  // Catches: a slow sender at the head of the line that holds it (its
  // frame timeout starts again with every byte), so that the worker behind
  // it is the one whose push times out; a refusal that does not name the
  // slow worker and the bound; and a refused head that reached the
  // variables, or that is counted as applied.
  const size_t n = 300000;
  bed b;
  auto sf = b.make("atosf", n, 2, "adam", "async", 2000);
  auto pl = b.make("ato", n, 2, "adam", "async", 2000); // the bound: 500 ms
  auto pushes = b.stats(pl).pushes;
  raw_peer p{b.port};
  auto g0 = gradient(n + 1, 3), g1 = gradient(n + 1, 4);
  p.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p.send_all(g0.bytes(), g0.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes > pushes; }));
  // Worker 0's sender is held here (this thread sends no more of it) until
  // the push behind it has its answer: that answer may not wait for it.
  auto behind = push_one(pl, 1, 0, g1, 1, true);
  check_same(behind, push_one(sf, 1, 0, g1, 1, false));
  CHECK(behind->first == 1);
  check_same_state(b, pl, sf);
  // The slow push is read to its end, and hears why it was refused.
  p.send_all(g0.bytes() + g0.nbytes() / 2, g0.nbytes() - g0.nbytes() / 2);
  auto a = read_answer(p);
  REQUIRE(a.read);
  CHECK(a.status == static_cast<uint8_t>(af_error::timeout));
  CHECK_THAT(a.text, Catch::Contains("the streamed push of worker 0"));
  CHECK_THAT(a.text, Catch::Contains("of 300001 floats"));
  CHECK_THAT(a.text, Catch::Contains("500 ms"));
  CHECK_THAT(a.text, Catch::Contains("no variable changed"));
  check_same_state(b, pl, sf);
  auto st = b.stats(pl);
  CHECK(st.applied == 1);
  CHECK(st.refused == 1);
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

TEST_CASE("while a streamed async push is in line a store-and-forward push with values takes its "
          "place in the line, and is applied when its turn comes",
          "[pipeline][members]") {
  // Catches: a whole push (a worker on the ps's host over shared memory, or
  // over TLS: it cannot stream) refused while another worker's streamed
  // push is in line, so that a job with a local and a remote worker fails;
  // one applied under the streamed push (whose commit then installs over
  // it) or out of its turn.
  const size_t n = 300000;
  bed b;
  auto sf = b.make("amxsf", n, 2, "momentum", "async");
  auto pl = b.make("amx", n, 2, "momentum", "async");
  auto pushes = b.stats(pl).pushes;
  raw_peer p{b.port};
  auto g0 = gradient(n + 1, 3), g1 = gradient(n + 1, 4);
  p.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p.send_all(g0.bytes(), g0.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes > pushes; }));
  push_result whole{make_error(af_error::internal, "")};
  std::thread t1{[&] { whole = push_one(pl, 1, 0, g1, 1, false); }};
  bool queued = eventually([&] { return b.stats(pl).pushes > pushes + 1; });
  // The rest of the streamed push: it commits first, then the whole one.
  p.send_all(g0.bytes() + g0.nbytes() / 2, g0.nbytes() - g0.nbytes() / 2);
  auto first = read_answer(p);
  t1.join();
  REQUIRE(queued);
  REQUIRE(first.read);
  CHECK(first.status == 0);
  CHECK(first.version == 1);
  auto want0 = push_one(sf, 0, 0, g0, 1, false);
  REQUIRE(want0);
  REQUIRE(first.values.size() * sizeof(float) == want0->second.nbytes());
  CHECK(std::memcmp(first.values.data(), want0->second.bytes(), want0->second.nbytes()) == 0);
  check_same(whole, push_one(sf, 1, 0, g1, 1, false));
  CHECK(whole->first == 2);
  check_same_state(b, pl, sf);
  auto st = b.stats(pl);
  CHECK(st.applied == 2);
  CHECK(st.staleness == b.stats(sf).staleness);
}

TEST_CASE("streamed and store-and-forward async pushes interleaved in the line give the values, "
          "slots and answers of store-and-forward pushes in that order, bit for bit",
          "[pipeline][members]") {
  // Catches: a whole push in line applied at the wrong global step, from
  // variables a streamed push ahead of it had not yet installed, or
  // answered with parameters of another point in the order; a streamed
  // push behind a whole one that never starts; bookkeeping (staleness,
  // applied, the global step) that differs from store-and-forward's.
  const size_t n = 300000;
  bed b;
  auto sf = b.make("ilsf", n, 3, "adam", "async");
  auto pl = b.make("ilpl", n, 3, "adam", "async");
  struct push {
    uint32_t worker;
    uint64_t step, seq;
    uint32_t seed;
    bool streamed;
  };
  // Two lines of three: worker 0 streams by hand (held half way until the
  // other two are in line behind it), the others push whole or streamed.
  const std::vector<std::vector<push>> lines{
    {{0, 0, 1, 31, true}, {1, 0, 1, 32, false}, {2, 0, 1, 33, true}},
    {{0, 1, 2, 34, true}, {2, 3, 2, 35, false}, {1, 2, 2, 36, true}}};
  std::vector<push_result> got;
  for (const auto& line : lines) {
    auto pushes = b.stats(pl).pushes;
    const auto& head = line[0];
    auto g = gradient(n + 1, head.seed);
    raw_peer p{b.port};
    p.send_streamed_head(pl.name, pl.tokens[0], 0, head.step, head.seq, n + 1);
    p.send_all(g.bytes(), g.nbytes() / 2);
    REQUIRE(eventually([&] { return b.stats(pl).pushes == pushes + 1; }));
    std::vector<push_result> behind(2, push_result{make_error(af_error::internal, "")});
    std::vector<std::thread> threads;
    bool queued = true;
    for (size_t k = 1; k < 3; ++k) {
      const auto& x = line[k];
      threads.emplace_back([&, k, x] {
        behind[k - 1] = push_one(pl, x.worker, x.step, gradient(n + 1, x.seed), x.seq, x.streamed);
      });
      queued = queued && eventually([&] { return b.stats(pl).pushes == pushes + 1 + k; });
    }
    p.send_all(g.bytes() + g.nbytes() / 2, g.nbytes() - g.nbytes() / 2);
    auto a = read_answer(p);
    for (auto& t : threads)
      t.join();
    REQUIRE(queued);
    REQUIRE(a.read);
    CHECK(a.status == 0);
    tensor values{dtype::float32, {static_cast<int64_t>(n + 1)}};
    std::memcpy(values.mutable_bytes(), a.values.data(), values.nbytes());
    got.push_back(push_result{std::make_pair(a.version, values)});
    got.push_back(behind[0]);
    got.push_back(behind[1]);
  }
  size_t i = 0;
  for (const auto& line : lines)
    for (const auto& x : line) {
      INFO("push " << i << " of worker " << x.worker << (x.streamed ? ", streamed" : ", whole"));
      check_same(got[i], push_one(sf, x.worker, x.step, gradient(n + 1, x.seed), x.seq, false));
      CHECK(got[i]->first == i + 1);
      ++i;
    }
  check_same_state(b, pl, sf);
  auto a = b.stats(sf), c = b.stats(pl);
  CHECK(c.applied == 6);
  CHECK(c.staleness == a.staleness);
}
