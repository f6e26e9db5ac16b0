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
