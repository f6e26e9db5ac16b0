// Streamed pushes (wire::kind::push_streamed) that lie or misbehave, sent by
// hand to a ps with a pipelined round (sync) or a line of streamed pushes
// (async) in progress: each is refused by name or dropped, the ps never
// hangs, nothing is half applied, and the honest workers' pushes go on to
// the store-and-forward result. Plain TCP only: not tagged [plane] (see
// test_pipelined_push.cpp).
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
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

/// Whether `p` has bytes to read now.
bool readable(const raw_peer& p) {
  pollfd q{p.fd, POLLIN, 0};
  return ::poll(&q, 1, 0) == 1;
}

} // namespace

TEST_CASE("a streamed async push sent again under its number while the first is in line is "
          "refused by name, and its gradient is applied once",
          "[pipeline][members]") {
  // Catches: a line of streamed async pushes that checks a push's number
  // only against the pushes already committed (seq_taken), so that a
  // retry of a push still in line (its answer lost, its worker joined
  // again) joins the line too, and the gradient is applied twice.
  const size_t n = 40000; // three chunks
  bed b;
  auto sf = b.make("dupsf", n, 2, "sgd", "async");
  auto pl = b.make("duppl", n, 2, "sgd", "async");
  auto g0 = gradient(n + 1, 1), g1 = gradient(n + 1, 2);
  REQUIRE(sf.chans[0]->aggregate(wire::kind::push, sf.name, 0, 0, {g0}, 20s, sf.tokens[0], 1));
  REQUIRE(sf.chans[1]->aggregate(wire::kind::push, sf.name, 1, 0, {g1}, 20s, sf.tokens[1], 1));
  auto pushes = b.stats(pl).pushes;
  raw_peer p0{b.port}, p1{b.port}, again{b.port};
  // Worker 0 first in line, half sent: the others wait behind it.
  p0.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p0.send_all(g0.bytes(), g0.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes == pushes + 1; }));
  p1.send_streamed_head(pl.name, pl.tokens[1], 1, 0, 1, n + 1);
  p1.send_all(g1.bytes(), g1.nbytes());
  REQUIRE(eventually([&] { return b.stats(pl).pushes == pushes + 2; }));
  // Worker 1's push 1 once more, on another connection.
  again.send_streamed_head(pl.name, pl.tokens[1], 1, 0, 1, n + 1);
  again.send_all(g1.bytes(), g1.nbytes());
  REQUIRE(eventually([&] { return readable(again) || b.stats(pl).pushes == pushes + 3; }));
  p0.send_all(g0.bytes() + g0.nbytes() / 2, g0.nbytes() - g0.nbytes() / 2);
  auto a0 = read_answer(p0), a1 = read_answer(p1), a2 = read_answer(again);
  REQUIRE(a0.read);
  REQUIRE(a1.read);
  REQUIRE(a2.read);
  CHECK(a0.status == 0);
  CHECK(a1.status == 0);
  CHECK(a1.version == 2);
  CHECK(a2.status == static_cast<uint8_t>(af_error::already_exists));
  CHECK_THAT(a2.text, Catch::Contains("worker 1"));
  CHECK_THAT(a2.text, Catch::Contains("push 1"));
  CHECK_THAT(a2.text, Catch::Contains("in line"));
  CHECK(b.stats(pl).applied == 2);
  check_same_state(b, pl, sf);
}

namespace {

/// A streamed push's header with `change` applied, then its prefix and
/// name, sent by `p` (its floats are not sent: a refusal comes first).
template <class Change>
void send_lying_head(raw_peer& p, const std::string& name, const std::string& token,
                     uint32_t worker, size_t floats, Change change) {
  wire::header h;
  wire::push_prefix pre;
  std::memcpy(pre.token, token.data(), std::min(token.size(), sizeof(pre.token)));
  pre.seq = 1;
  h.kind = static_cast<uint8_t>(wire::kind::push_streamed);
  h.name_len = static_cast<uint32_t>(sizeof(pre) + name.size());
  h.reserved = static_cast<uint16_t>(worker);
  h.has_tensor = 1;
  h.dtype = static_cast<uint8_t>(dtype::float32);
  h.rank = 1;
  h.dims[0] = static_cast<int64_t>(floats);
  h.payload_bytes = floats * sizeof(float);
  change(h);
  p.send_all(&h, sizeof(h));
  p.send_all(&pre, sizeof(pre));
  p.send_all(name.data(), name.size());
}

} // namespace

TEST_CASE("streamed pushes that lie in their header are refused by name while a pipelined round "
          "is in progress, which then completes as store-and-forward would",
          "[pipeline][members]") {
  // Catches: a lying kind-15 frame (a size, a dtype, an aggregator, a
  // token or a worker that is not what the ps holds) that crashes or hangs
  // the ps, reaches the round (a member's slot taken, a half-applied
  // chunk), or is answered without naming what is wrong.
  const size_t n = 40000;
  const std::string stranger(16, 'x');
  bed b;
  auto sf = b.make("liesf", n, 2, "momentum");
  auto pl = b.make("liepl", n, 2, "momentum");
  auto g0 = gradient(n + 1, 1), g1 = gradient(n + 1, 2);
  std::vector<push_result> want(2, push_result{make_error(af_error::internal, "")});
  std::thread t{[&] {
    want[1] = sf.chans[1]->aggregate(wire::kind::push, sf.name, 1, 0, {g1}, 20s, sf.tokens[1], 1);
  }};
  want[0] = sf.chans[0]->aggregate(wire::kind::push, sf.name, 0, 0, {g0}, 20s, sf.tokens[0], 1);
  t.join();
  REQUIRE(want[0]);
  // Worker 0's round in progress, half sent.
  auto pushes = b.stats(pl).pushes;
  raw_peer p0{b.port};
  p0.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p0.send_all(g0.bytes(), g0.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes == pushes + 1; }));
  struct lie {
    const char* what;
    std::string name, token;
    uint32_t worker;
    void (*change)(wire::header&);
    const char* said;
  };
  auto none = [](wire::header&) {};
  const std::vector<lie> lies{
    {"one float short", pl.name, pl.tokens[1], 1,
     [](wire::header& h) { h.dims[0] -= 1; h.payload_bytes -= 4; }, "expected float32[40001]"},
    {"int32 values", pl.name, pl.tokens[1], 1,
     [](wire::header& h) { h.dtype = static_cast<uint8_t>(dtype::int32); }, "expected float32"},
    {"a payload size that is not its shape's", pl.name, pl.tokens[1], 1,
     [](wire::header& h) { h.payload_bytes -= 1; }, "payload of 160003 bytes"},
    {"an aggregator that does not exist", "test/nope", pl.tokens[1], 1, none,
     "no aggregator 'test/nope'"},
    {"another worker's token", pl.name, pl.tokens[0], 1, none, "does not carry the token"},
    {"a token of another job", pl.name, stranger, 1, none, "does not carry the token"},
    {"a worker index the aggregator does not have", pl.name, stranger, 7, none,
     "worker 7"},
  };
  for (const auto& l : lies) {
    CAPTURE(l.what);
    raw_peer p{b.port};
    send_lying_head(p, l.name, l.token, l.worker, n + 1, l.change);
    auto a = read_answer(p);
    CHECK(a.read);
    CHECK(a.status != 0);
    CHECK_THAT(a.text, Catch::Contains(l.said));
  }
  CHECK(b.stats(pl).pushes == pushes + 1);
  // The honest members complete the round.
  std::vector<push_result> got(1, push_result{make_error(af_error::internal, "")});
  std::thread t1{[&] {
    got[0] = pl.chans[1]->push_streamed(pl.name, 1, 0, {g1}, 20s, pl.tokens[1], 1);
  }};
  REQUIRE(eventually([&] { return b.stats(pl).pushes == pushes + 2; }));
  p0.send_all(g0.bytes() + g0.nbytes() / 2, g0.nbytes() - g0.nbytes() / 2);
  auto a0 = read_answer(p0);
  t1.join();
  REQUIRE(got[0]);
  REQUIRE(a0.read);
  CHECK(a0.status == 0);
  CHECK(got[0]->first == 1);
  REQUIRE(got[0]->second.nbytes() == want[0]->second.nbytes());
  CHECK(std::memcmp(got[0]->second.bytes(), want[0]->second.bytes(), want[0]->second.nbytes())
        == 0);
  check_same_state(b, pl, sf);
}

TEST_CASE("a member that stops reading its streamed answer holds only its own connection, the "
          "round commits and the other member's answer is whole",
          "[pipeline][members]") {
  // Catches: a ps thread that writes a member's answer while it holds the
  // aggregator's lock, or a round whose commit waits for every answer to
  // be written, so that one worker that stops reading (its process
  // stopped, its link full) stalls the others' pushes.
  const size_t n = size_t{6} << 20; // 24 MiB: more than loopback's socket buffers hold
  bed b;
  auto pl = b.make("stall", n, 2, "sgd");
  auto g0 = gradient(n + 1, 1), g1 = gradient(n + 1, 2);
  raw_peer p0{b.port};
  auto pushes = b.stats(pl).pushes;
  // Worker 0 sends its whole push and never reads: the ps's writes of its
  // answer fill the socket and wait.
  std::thread sender{[&] {
    p0.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
    p0.send_all(g0.bytes(), g0.nbytes());
  }};
  REQUIRE(eventually([&] { return b.stats(pl).pushes == pushes + 1; }));
  auto r = pl.chans[1]->push_streamed(pl.name, 1, 0, {g1}, 20s, pl.tokens[1], 1);
  sender.join();
  REQUIRE(r);
  CHECK(r->first == 1);
  // The answer is the variables as the round left them, every byte.
  auto saved = b.saved(pl);
  CHECK(saved.second == 1);
  REQUIRE(r->second.nbytes() == saved.first.size());
  CHECK(std::memcmp(r->second.bytes(), saved.first.data(), saved.first.size()) == 0);
  CHECK(b.stats(pl).applied == 1);
}

TEST_CASE("a worker stopped mid-push at the head of the async line is dropped at the frame "
          "timeout, and the push behind it is applied",
          "[pipeline][members]") {
  // Catches: a line of streamed async pushes whose head, stopped without
  // hanging up (SIGSTOP), holds the others past their step timeout, or
  // whose drop leaves a half-applied push or a line that never moves.
  const size_t n = 40000;
  auto opts = embedded_cluster::defaults();
  opts.data_frame_timeout_ms = 500;
  bed b{opts};
  auto sf = b.make("hsf", n, 2, "adam", "async");
  auto pl = b.make("hpl", n, 2, "adam", "async", 20000);
  auto g0 = gradient(n + 1, 1), g1 = gradient(n + 1, 2);
  auto want = sf.chans[1]->aggregate(wire::kind::push, sf.name, 1, 0, {g1}, 20s, sf.tokens[1], 1);
  REQUIRE(want);
  auto pushes = b.stats(pl).pushes;
  raw_peer p0{b.port};
  p0.send_streamed_head(pl.name, pl.tokens[0], 0, 0, 1, n + 1);
  p0.send_all(g0.bytes(), g0.nbytes() / 2);
  REQUIRE(eventually([&] { return b.stats(pl).pushes == pushes + 1; }));
  auto r = pl.chans[1]->push_streamed(pl.name, 1, 0, {g1}, 20s, pl.tokens[1], 1);
  REQUIRE(r);
  CHECK(r->first == 1);
  REQUIRE(r->second.nbytes() == want->second.nbytes());
  CHECK(std::memcmp(r->second.bytes(), want->second.bytes(), want->second.nbytes()) == 0);
  check_same_state(b, pl, sf);
  CHECK(b.stats(pl).applied == 1);
}

TEST_CASE("a streamed push over shared memory is refused by name and the connection goes on "
          "store-and-forward",
          "[pipeline][shm]") {
  // Catches: a kind-15 frame on a connection whose bytes do not go straight
  // over a TCP socket (shared memory here, TLS alike), where a streamed
  // answer cannot be written, taken into a round, answered half, or
  // answered with a message that does not say what to do.
  const size_t n = 40000;
  bed b;
  auto pl = b.make("shmpl", n, 1, "sgd");
  auto chan = data_channel::connect("127.0.0.1", b.port, "ps", 5s); // shared memory allowed
  REQUIRE(chan);
  REQUIRE_FALSE((*chan)->settle(5s));
  if ((*chan)->transport() != "shared memory") { // ACTORFLOW_DATA_SHM=off, say
    WARN("no shared memory between this test and its ps: " + (*chan)->transport());
    return;
  }
  auto g = gradient(n + 1, 1);
  // The client sends no kind-15 frame there: this one is written with its
  // prefix (token, push number) by hand, in front of the name.
  wire::push_prefix pre;
  std::memcpy(pre.token, pl.tokens[0].data(), sizeof(pre.token));
  pre.seq = 1;
  auto prefixed = std::string(reinterpret_cast<const char*>(&pre), sizeof(pre)) + pl.name;
  auto r = (*chan)->aggregate(wire::kind::push_streamed, prefixed, 0, 0, {g}, 10s);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::invalid_argument));
  CHECK_THAT(describe(r.error()), Catch::Contains("plaintext TCP data plane only"));
  CHECK_THAT(describe(r.error()), Catch::Contains("shared memory"));
  CHECK(b.stats(pl).pushes == 0);
  auto ok = (*chan)->aggregate(wire::kind::push, pl.name, 0, 0, {g}, 10s, pl.tokens[0], 1);
  REQUIRE(ok);
  CHECK(ok->first == 1);
}

TEST_CASE("a store-and-forward push joins a pipelined round its worker is a member of, and the "
          "round gives the store-and-forward round's bits",
          "[pipeline][members]") {
  // Catches: a pipelined round that refuses a member's push sent
  // store-and-forward. A worker with pipeline_sync on sends one wherever
  // its connection is not plain TCP (shared memory on the ps's host, TLS,
  // UCX) and over CAF: a job with one worker on the ps's host and one
  // elsewhere failed every step the remote worker's push began.
  const size_t n = 300000;
  const auto kind = GENERATE(std::string{"sgd"}, std::string{"momentum"});
  CAPTURE(kind);
  bed b;
  auto sf = b.make("mixsf", n, 2, kind);
  auto pl = b.make("mixpl", n, 2, kind);
  for (uint64_t step = 0; step < 2; ++step) {
    CAPTURE(step);
    auto g0 = gradient(n + 1, static_cast<uint32_t>(10 * step + 1));
    auto g1 = gradient(n + 1, static_cast<uint32_t>(10 * step + 2));
    const uint64_t seq = step + 1;
    std::vector<push_result> want(2, push_result{make_error(af_error::internal, "")});
    std::thread t{[&] {
      want[1] = sf.chans[1]->aggregate(wire::kind::push, sf.name, 1, step, {g1}, 20s,
                                       sf.tokens[1], seq);
    }};
    want[0] = sf.chans[0]->aggregate(wire::kind::push, sf.name, 0, step, {g0}, 20s, sf.tokens[0],
                                     seq);
    t.join();
    REQUIRE(want[0]);
    // Worker 0 streams (the pipelined round begins with it), worker 1's push
    // comes whole.
    auto pushes = b.stats(pl).pushes;
    push_result streamed{make_error(af_error::internal, "")};
    std::thread t0{[&] {
      streamed = pl.chans[0]->push_streamed(pl.name, 0, step, {g0}, 20s, pl.tokens[0], seq);
    }};
    REQUIRE(eventually([&] { return b.stats(pl).pushes == pushes + 1; }));
    auto whole = pl.chans[1]->aggregate(wire::kind::push, pl.name, 1, step, {g1}, 20s,
                                        pl.tokens[1], seq);
    t0.join();
    REQUIRE(whole);
    REQUIRE(streamed);
    CHECK(whole->first == step + 1);
    CHECK(streamed->first == step + 1);
    for (const auto* got : {&*whole, &*streamed}) {
      REQUIRE(got->second.nbytes() == want[0]->second.nbytes());
      CHECK(std::memcmp(got->second.bytes(), want[0]->second.bytes(), want[0]->second.nbytes())
            == 0);
    }
    check_same_state(b, pl, sf);
  }
}
