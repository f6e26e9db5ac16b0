// A sparse worker's link through a ps's recovery (dist/sparse_recovery.hpp),
// over a scripted inner link: which answer goes with which request once
// the requests still out are sent again.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>

#include "dist/sparse_recovery.hpp"
#include "messages/error.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

/// An inner link whose "connection" is a queue of request names: an answer
/// carries its request's first letter as its version. The next finish()
/// after break_next is set fails as a broken connection (peer_down), losing
/// every request out; after that, a request named `refuse` is refused when
/// sent (an error that is not the ps's death).
class scripted_link : public data_plane_ps_link {
public:
  scripted_link() : data_plane_ps_link(nullptr, "agg", 0, "", 0, 1s) {}

  caf::error start_gather_rows(const std::string& var, const tensor&) override { return go(var); }
  caf::error start_read(const std::string& var) override { return go(var); }
  caf::error start_push(uint64_t, const sparse_push_values&) override { return go("push"); }
  caf::expected<answer> finish() override {
    if (out.empty())
      return make_error(af_error::internal, "no request out");
    auto name = out.front();
    out.pop_front();
    if (break_next) {
      break_next = false;
      out.clear();
      armed = true;
      return make_error(af_error::peer_down, "the connection broke");
    }
    answer a;
    a.version = static_cast<uint64_t>(name.at(0));
    return a;
  }

  std::deque<std::string> out;
  bool break_next = false;
  bool armed = false;
  std::string refuse;

private:
  caf::error go(const std::string& var) {
    if (armed && var == refuse)
      return make_error(af_error::invalid_argument, "refused: " + var);
    out.push_back(var);
    return caf::none;
  }
};

} // namespace

TEST_CASE("a request refused when the requests out are sent again after a recovery leaves the "
          "other answers with their own requests",
          "[sparse_recovery]") {
  // Catches: the requests still out sent again after a recovery, one of
  // them refused (not the ps's death), and the link then dropping the
  // oldest request instead of the refused one: the refused request's turn
  // would read the answer of the one before it.
  param_shard shard;
  shard.task = "/job:ps/task:0";
  int recoveries = 0;
  sparse_recovery rec{
    [&](size_t, uint64_t, const std::string&, bool) -> caf::expected<recovered_shard> {
      ++recoveries;
      return recovered_shard{shard, 0}; // the same process: nothing to join
    },
    [](size_t, const aggregator_actor&) -> caf::expected<std::pair<std::string, uint64_t>> {
      return make_error(af_error::internal, "no join expected");
    },
    [](const param_shard&) -> caf::expected<std::unique_ptr<data_channel>> {
      return std::unique_ptr<data_channel>{};
    },
    {shard}};
  scripted_link inner;
  recovering_ps_link link{inner, 0, rec};
  inner.refuse = "b";
  REQUIRE_FALSE(link.start_read("a"));
  REQUIRE_FALSE(link.start_read("b"));
  REQUIRE_FALSE(link.start_read("c"));
  inner.break_next = true;
  auto a = link.finish();
  CHECK(recoveries == 1);
  REQUIRE(a);
  CHECK(a->version == 'a');
  auto b = link.finish();
  REQUIRE_FALSE(b);
  CHECK(is(b.error(), af_error::invalid_argument));
  auto c = link.finish();
  REQUIRE(c);
  CHECK(c->version == 'c');
  CHECK(inner.out.empty());
}

TEST_CASE("a ps that cannot be reached right after its recovery is waited for again, not given "
          "up on",
          "[sparse_recovery]") {
  // Catches: a link whose new connection failed (the ps died again just
  // after its recovery) asking the recovery for the generation it knew
  // before: that one had moved on, so the recovery answered at once, and
  // three tries later the link failed without ever waiting for the ps.
  param_shard shard;
  shard.task = "/job:ps/task:0";
  int recoveries = 0;
  sparse_recovery rec{
    [&](size_t, uint64_t, const std::string&, bool) -> caf::expected<recovered_shard> {
      ++recoveries; // the wait for the ps: it is back after the second
      return recovered_shard{shard, 0};
    },
    [](size_t, const aggregator_actor&) -> caf::expected<std::pair<std::string, uint64_t>> {
      return make_error(af_error::internal, "no join expected");
    },
    [&](const param_shard&) -> caf::expected<std::unique_ptr<data_channel>> {
      if (recoveries < 2)
        return make_error(af_error::unreachable, "connection refused");
      return std::unique_ptr<data_channel>{};
    },
    {shard}};
  scripted_link inner;
  recovering_ps_link link{inner, 0, rec};
  REQUIRE_FALSE(link.start_read("a"));
  inner.break_next = true;
  auto a = link.finish();
  INFO((a ? std::string{} : describe(a.error())));
  REQUIRE(a);
  CHECK(a->version == 'a');
  CHECK(recoveries == 2);
}

// Catches a read of a stopped ps whose error named the connection's timeout
// (the push's wait: step_timeout_ms + 5 s, "timed out after 7000 ms") when
// it had waited the read's own (step_timeout_ms: 2000 there), so that the
// user took the read to wait 7 s; and one that does not say what to do.
TEST_CASE("a read of a ps that does not answer fails within the read's wait, naming that wait "
          "and what to do",
          "[sparse_step][recovery]") {
  // A loopback port that accepts (the kernel does, from its backlog) and
  // never answers: a stopped ps.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd, 8) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  // The connection's own timeout 3000 ms (as the job's: the push's wait),
  // the link's 300 ms (step_timeout_ms). No shared memory: its offer waits
  // for an answer too.
  auto ch = data_channel::connect("127.0.0.1", ntohs(addr.sin_port), "/job:ps/task:1", 3000ms, {},
                                  nullptr, nullptr, false);
  REQUIRE(ch);
  data_plane_ps_link link{std::move(*ch), "agg", 0, std::string(16, 't'), 0, 300ms};
  tensor ids{dtype::int64, {1}};
  ids.mutable_data<int64_t>()[0] = 0;
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE_FALSE(link.start_gather_rows("user_emb/part_1", ids));
  auto r = link.finish();
  auto took = std::chrono::steady_clock::now() - t0;
  ::close(fd);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::timeout));
  auto what = describe(r.error());
  INFO(what);
  CHECK(what.find("timed out after 300 ms waiting for /job:ps/task:1 to answer gather_rows of "
                  "'user_emb/part_1'")
        != std::string::npos);
  CHECK(what.find("the read's wait is step_timeout_ms") != std::string::npos);
  CHECK(what.find("3000 ms") == std::string::npos);
  CHECK(what.find("continue it, or with ps_recovery_timeout_ms") != std::string::npos);
  CHECK(took < 2500ms); // the read's 300 ms and a margin, below the connection's 3000
  CHECK(ps_may_be_gone(r.error(), link.broken())); // a recovery still takes it for a gone ps
}
