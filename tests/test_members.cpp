// Who a push speaks for, end to end (messages/aggregator.hpp's membership):
// a push over the data plane is taken only with the token its worker's join
// was answered with, and a job whose worker failed fails at its chief. The
// aggregator's side alone is in test_aggregator.cpp ("[members]").
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/ringbuffer_sink.h>

#include "caf/all.hpp"

#include "net/data_plane.hpp"
#include "dist/embedded_cluster.hpp"
#include "core/log.hpp"
#include "dist/training.hpp"
#include "messages/error.hpp"
#include "core/wire_format.hpp"
#include "members.hpp"
#include "log_capture.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

using af::test::log_capture;

int connect_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// The local end of `fd` as "127.0.0.1:port" (how the node names its peer).
std::string local_address(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

/// Sends one push or pull frame by hand; the reply's status and text.
std::pair<uint8_t, std::string> raw_frame(int fd, wire::kind kind, const std::string& name,
                                          uint32_t worker, const std::vector<float>& values) {
  wire::header h;
  h.kind = static_cast<uint8_t>(kind);
  h.name_len = static_cast<uint32_t>(name.size());
  h.reserved = static_cast<uint16_t>(worker);
  if (!values.empty()) {
    h.has_tensor = 1;
    h.dtype = static_cast<uint8_t>(dtype::float32);
    h.rank = 1;
    h.dims[0] = static_cast<int64_t>(values.size());
    h.payload_bytes = values.size() * sizeof(float);
  }
  REQUIRE(wire::validate(h).empty());
  REQUIRE(::write(fd, &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h)));
  REQUIRE(::write(fd, name.data(), name.size()) == static_cast<ssize_t>(name.size()));
  if (!values.empty())
    REQUIRE(::write(fd, values.data(), h.payload_bytes) == static_cast<ssize_t>(h.payload_bytes));
  wire::header reply;
  REQUIRE(::recv(fd, &reply, sizeof(reply), MSG_WAITALL) == static_cast<ssize_t>(sizeof(reply)));
  std::string text(reply.payload_bytes, '\0');
  if (!text.empty())
    REQUIRE(::recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
  return {reply.status, reply.status == 0 ? std::string{} : text};
}

} // namespace

TEST_CASE("over the data plane a push is taken only with its worker's token, a forged one is "
          "refused naming the peer and changes nothing",
          "[members][plane]") {
  // Catches: a data-plane push that claimed worker 1's index with a finite
  // gradient 10^30 times the others' being applied (the model destroyed),
  // the real worker 1's push of that step then refused as a second one.
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("w", {2, 3}, initializer::constant(1)));
    REQUIRE(s->variable("b", {3}, initializer::zeros()));
  }
  REQUIRE_FALSE(s->initialize());
  aggregator_spec spec;
  spec.name = "test/members";
  spec.mode = "sync";
  spec.variables = {"w", "b"};
  spec.workers = 2;
  spec.optimizer.lr = 1.0;
  spec.step_timeout_ms = 20000;
  auto agg = s->aggregator("ps", 0, spec);
  REQUIRE(agg);
  caf::scoped_actor self{s->system()};
  std::string tokens[2] = {test::join_for_token(self, *agg, 0), test::join_for_token(self, *agg, 1)};
  REQUIRE(tokens[0].size() == 16);
  REQUIRE(tokens[1].size() == 16);
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  auto connect = [&] {
    auto chan = data_channel::connect("127.0.0.1", info->data_port, "ps", 5s);
    REQUIRE(chan);
    return std::move(*chan);
  };
  auto huge = std::vector<tensor>{tensor::filled(dtype::float32, {9}, 1e30f)};
  log_capture logs;
  int fd = connect_loopback(info->data_port);
  REQUIRE(fd >= 0);
  auto peer = local_address(fd);
  SECTION("a forged token") {
    auto forged = tokens[1];
    forged[5] = static_cast<char>(forged[5] ^ 0x40);
    wire::push_prefix pre;
    std::memcpy(pre.token, forged.data(), sizeof(pre.token));
    pre.seq = 1;
    std::string name(reinterpret_cast<const char*>(&pre), sizeof(pre));
    name += spec.name;
    auto [status, text] = raw_frame(fd, wire::kind::push, name, 1, std::vector<float>(9, 1e30f));
    CHECK(status == static_cast<uint8_t>(af_error::invalid_argument));
    CHECK_THAT(text, Catch::Contains("worker 1") && Catch::Contains("token")
                       && Catch::Contains("data-plane peer " + peer));
    CHECK(logs.has("refused a push for worker 1", "data-plane peer " + peer));
  }
  SECTION("no token (another actorflow, or a stranger)") {
    auto [status, text] = raw_frame(fd, wire::kind::push, spec.name, 1, std::vector<float>(9, 1e30f));
    CHECK(status == static_cast<uint8_t>(af_error::invalid_argument));
    CHECK_THAT(text, Catch::Contains("prefix"));
  }
  SECTION("the other member's token") {
    auto chan = connect();
    auto r = chan->aggregate(wire::kind::push, spec.name, 1, 0, huge, 5s, tokens[0], 1);
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::invalid_argument));
  }
  ::close(fd);
  // nothing was taken: no push counted, the values as they were
  caf::expected<aggregator_stats> st{make_error(af_error::internal, "none")};
  self->request(*agg, 5s, stats_atom::value)
    .receive([&](aggregator_stats& x) { st = x; }, [&](caf::error& e) { st = e; });
  REQUIRE(st);
  CHECK(st->pushes == 0);
  CHECK(st->global_step == 0);
  // the members' own pushes of step 0 make the round
  std::pair<uint64_t, tensor> first;
  caf::error first_err;
  std::thread other{[&] {
    auto chan = connect();
    auto r = chan->aggregate(wire::kind::push, spec.name, 1, 0,
                             {tensor::filled(dtype::float32, {9}, 3)}, 10s, tokens[1], 1);
    if (r)
      first = std::move(*r);
    else
      first_err = std::move(r.error());
  }};
  auto mine = connect()->aggregate(wire::kind::push, spec.name, 0, 0,
                                   {tensor::filled(dtype::float32, {9}, 1)}, 10s, tokens[0], 1);
  other.join();
  REQUIRE(mine);
  REQUIRE_FALSE(first_err);
  CHECK(mine->first == 1);
  CHECK(first.first == 1);
  CHECK(mine->second.at(0) == -1.0); // w: 1 - mean(1, 3)
}

TEST_CASE("over the data plane a push without its worker's token is refused before its values "
          "are read, dense or sparse",
          "[members][plane][sparse_push]") {
  // Catches: a node that reads (and allocates for) a stranger's push
  // before its token is checked: one connection each, a stranger could make
  // a ps hold a model's (or, sparse, a table's) worth of memory for every
  // push it starts and never finishes. Here the values never come: only a
  // refusal made before reading them is answered at all.
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("w", {4}, initializer::constant(1)));
    REQUIRE(s->variable("emb", {1000, 8}, initializer::constant(1)));
  }
  REQUIRE_FALSE(s->initialize());
  aggregator_spec dense;
  dense.name = "test/gate_dense";
  dense.mode = "async";
  dense.variables = {"w"};
  dense.workers = 1;
  aggregator_spec sparse = dense;
  sparse.name = "test/gate_sparse";
  sparse.variables = {"w", "emb"};
  sparse.sparse = {"emb"};
  auto dense_agg = s->aggregator("ps", 0, dense);
  auto sparse_agg = s->aggregator("ps", 0, sparse);
  REQUIRE(dense_agg);
  REQUIRE(sparse_agg);
  caf::scoped_actor self{s->system()};
  auto token = test::join_for_token(self, *sparse_agg, 0);
  REQUIRE(token.size() == 16);
  REQUIRE(test::join_for_token(self, *dense_agg, 0).size() == 16);
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  log_capture logs;
  // Worker 0's token with one bit flipped: another member's would do too.
  auto forged = token;
  forged[3] = static_cast<char>(forged[3] ^ 0x01);
  for (bool is_sparse : {false, true}) {
    INFO((is_sparse ? "sparse" : "dense") << " push");
    int fd = connect_loopback(info->data_port);
    REQUIRE(fd >= 0);
    timeval tv{5, 0}; // a refusal comes at once; without one the node waits for the values
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    wire::push_prefix pre;
    std::memcpy(pre.token, forged.data(), sizeof(pre.token));
    pre.seq = 1;
    std::string name(reinterpret_cast<const char*>(&pre), sizeof(pre));
    name += is_sparse ? sparse.name : dense.name;
    wire::header h;
    h.kind = static_cast<uint8_t>(is_sparse ? wire::kind::push_sparse : wire::kind::push);
    h.name_len = static_cast<uint32_t>(name.size());
    h.reserved = 0;
    h.has_tensor = 1;
    h.dtype = static_cast<uint8_t>(is_sparse ? dtype::int32 : dtype::float32);
    h.rank = 1;
    // sparse: 1000 rows of the table's (the most a push may carry), with
    // their ids and the dense floats, as 4-byte words
    uint64_t bytes = is_sparse ? 8 + 4 * 4 + 1000 * (8 + 8 * 4) : 4 * 4;
    h.dims[0] = static_cast<int64_t>(bytes / 4);
    h.payload_bytes = bytes;
    REQUIRE(wire::validate(h).empty());
    REQUIRE(::write(fd, &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h)));
    REQUIRE(::write(fd, name.data(), name.size()) == static_cast<ssize_t>(name.size()));
    if (is_sparse) {
      uint64_t count = 1000; // the counts, and nothing after them
      REQUIRE(::write(fd, &count, sizeof(count)) == static_cast<ssize_t>(sizeof(count)));
    }
    wire::header reply;
    REQUIRE(::recv(fd, &reply, sizeof(reply), MSG_WAITALL) == static_cast<ssize_t>(sizeof(reply)));
    std::string text(reply.payload_bytes, '\0');
    REQUIRE(::recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
    CHECK(reply.status == static_cast<uint8_t>(af_error::invalid_argument));
    CHECK_THAT(text, Catch::Contains("worker 0") && Catch::Contains("token")
                       && Catch::Contains("before reading its values"));
    ::close(fd);
  }
  CHECK(logs.has("refused a push for worker 0", "before reading its values"));
  {
    // The member's token on a sparse push whose payload is no tensor
    // (has_tensor 0): refused as such, not parsed as counts and rows.
    int fd = connect_loopback(info->data_port);
    REQUIRE(fd >= 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    wire::push_prefix pre;
    std::memcpy(pre.token, token.data(), sizeof(pre.token));
    pre.seq = 1;
    std::string name(reinterpret_cast<const char*>(&pre), sizeof(pre));
    name += sparse.name;
    wire::header h;
    h.kind = static_cast<uint8_t>(wire::kind::push_sparse);
    h.name_len = static_cast<uint32_t>(name.size());
    h.payload_bytes = 8 + 4 * 4 + 8 + 8 * 4; // one row's push, as if it were one
    std::vector<char> payload(h.payload_bytes, 0);
    uint64_t one = 1;
    std::memcpy(payload.data(), &one, sizeof(one));
    if (wire::validate(h).empty()) { // a node's own check may refuse it first: fine too
      REQUIRE(::write(fd, &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h)));
      REQUIRE(::write(fd, name.data(), name.size()) == static_cast<ssize_t>(name.size()));
      REQUIRE(::write(fd, payload.data(), payload.size())
              == static_cast<ssize_t>(payload.size()));
      wire::header reply;
      REQUIRE(::recv(fd, &reply, sizeof(reply), MSG_WAITALL)
              == static_cast<ssize_t>(sizeof(reply)));
      std::string text(reply.payload_bytes, '\0');
      REQUIRE(::recv(fd, text.data(), text.size(), MSG_WAITALL)
              == static_cast<ssize_t>(text.size()));
      CHECK(reply.status == static_cast<uint8_t>(af_error::invalid_argument));
      CHECK_THAT(text, Catch::Contains("no tensor"));
    }
    ::close(fd);
  }
  // The member's own pushes go on: the gate holds its token.
  auto chan = data_channel::connect("127.0.0.1", info->data_port, "ps", 5s);
  REQUIRE(chan);
  std::vector<int64_t> one_id{7};
  tensor ids{dtype::int64, {1}};
  std::memcpy(ids.mutable_data<int64_t>(), one_id.data(), sizeof(int64_t));
  auto r = (*chan)->push_sparse(sparse.name, 0, 0, {tensor::filled(dtype::float32, {4}, 1)},
                                {ids}, {tensor::filled(dtype::float32, {1, 8}, 1)}, 5s, token, 1);
  REQUIRE(r);
  CHECK(*r == 1);
}

TEST_CASE("a pull that carries values is refused saying so, not as a size that matches",
          "[members][plane]") {
  // Catches: "pull to aggregator 'x': float32[9] values, expected
  // float32[9]": the refusal named a size mismatch that was not there; what
  // was wrong is that a pull carries no values.
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("w", {9}, initializer::constant(1)));
  }
  REQUIRE_FALSE(s->initialize());
  aggregator_spec spec;
  spec.name = "test/pull";
  spec.variables = {"w"};
  spec.workers = 1;
  REQUIRE(s->aggregator("ps", 0, spec));
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  int fd = connect_loopback(info->data_port);
  REQUIRE(fd >= 0);
  auto [status, text] = raw_frame(fd, wire::kind::pull, spec.name, 0, std::vector<float>(9, 0));
  CHECK(status == static_cast<uint8_t>(af_error::invalid_argument));
  CHECK_THAT(text, Catch::Contains("a pull sends none") && Catch::Contains("float32[9]"));
  CHECK_THAT(text, !Catch::Contains("expected"));
  // the connection goes on: a plain pull is answered
  auto [ok, none] = raw_frame(fd, wire::kind::pull, spec.name, 0, {});
  CHECK(ok == 0);
  ::close(fd);
}

TEST_CASE("over the data plane a push with a non-finite float in a later piece is refused "
          "naming it, the variables keep their values, and a sync round answers every updated float",
          "[members][plane]") {
  // Catches: the data plane's check of each piece as it arrives (which
  // spares the aggregator its own pass) passing a push whose first piece is
  // finite and a later one not: the NaN applied, the model destroyed.
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  constexpr int64_t n = 200000; // pieces of 64 K floats: the NaN is in the fourth
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("w", {n - 3}, initializer::constant(1)));
    REQUIRE(s->variable("b", {3}, initializer::constant(1)));
  }
  REQUIRE_FALSE(s->initialize());
  aggregator_spec spec;
  spec.name = "test/nonfinite";
  spec.mode = GENERATE(as<std::string>{}, "sync", "async");
  spec.variables = {"w", "b"};
  spec.workers = 1;
  spec.optimizer.lr = 1.0;
  auto agg = s->aggregator("ps", 0, spec);
  REQUIRE(agg);
  caf::scoped_actor self{s->system()};
  auto token = test::join_for_token(self, *agg, 0);
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  auto chan = data_channel::connect("127.0.0.1", info->data_port, "ps", 5s);
  REQUIRE(chan);
  auto grad = tensor::filled(dtype::float32, {n}, 0.5f);
  grad.mutable_data<float>()[199999] = std::numeric_limits<float>::quiet_NaN();
  auto r = (*chan)->aggregate(wire::kind::push, spec.name, 0, 0, {grad}, 10s, token, 1);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::non_finite));
  CHECK_THAT(describe(r.error()), Catch::Contains("'b'") && Catch::Contains("element 2 "));
  // a finite push goes through on the same connection, from the value as it was
  auto ok = (*chan)->aggregate(wire::kind::push, spec.name, 0, 0,
                               {tensor::filled(dtype::float32, {n}, 0.5f)}, 10s, token, 2);
  REQUIRE(ok);
  // every float of the answer (w's blocks, then b: the flat parameters the
  // sync round copies block by block as it updates them) is 1 - 0.5
  REQUIRE(ok->second.num_elements() == static_cast<size_t>(n));
  const float* p = ok->second.data<float>();
  CHECK(std::count(p, p + n, 0.5f) == n);
}

TEST_CASE("a job whose worker fails fails at its chief, naming the worker and its error",
          "[members][train]") {
  // Catches: the chief printing `train done` and exiting 0 while a worker of
  // the job had exited 1 (its done was counted like a finish).
  train::train_config c;
  c.mode = "async";
  c.log_every = 0;
  c.eval_every = 0;
  c.step_timeout_ms = 20000;
  c.steps = 1000;
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 2}});
  REQUIRE(cluster);
  std::vector<caf::expected<train_outcome>> results(2, make_error(af_error::internal, "not run"));
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      auto s = (*cluster)->session_for("worker", static_cast<int>(w));
      if (!s) {
        results[w] = std::move(s.error());
        return;
      }
      train_options opts;
      opts.shutdown_ps = false;
      opts.print = false;
      if (w == 1) // its gradients are never finite: it fails after 100 steps
        opts.tamper = [](uint64_t, std::vector<tensor>& grads) {
          grads[0].mutable_data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
        };
      results[w] = run_worker_task(*s, c, w, opts);
    });
  for (auto& t : threads)
    t.join();
  REQUIRE_FALSE(results[1]);
  CHECK(is(results[1].error(), af_error::non_finite));
  REQUIRE_FALSE(results[0]);
  CHECK(is(results[0].error(), af_error::aborted));
  CHECK_THAT(describe(results[0].error()),
             Catch::Contains("worker 1 /job:worker/task:1") && Catch::Contains("diverged"));
}
