// [connect]: what a session's connect and ping say when the node does not
// answer, and how long they take: one deadline for the whole connect (name
// lookup, TCP, handshakes), the ping's own timeout named in its error, and
// each error's code said once.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <future>
#include <sstream>
#include <string>

#include "caf/all.hpp"

#include "actors/session.hpp"
#include "actors/system.hpp"
#include "config/loopback.hpp"
#include "messages/error.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "wait.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

session_options with_connect_timeout(std::chrono::milliseconds t) {
  session_options o;
  o.timeout = 20s; // long: what ends each call here is the connect's deadline
  o.connect_timeout = t;
  return o;
}

cluster_spec one_ps_at(const std::string& address) {
  return value_of(cluster_spec::from_jobs({{"ps", {address}}}));
}

/// A listening socket on 127.0.0.1 whose accept queue is full (backlog 0
/// and one connection nobody accepted): the kernel drops the SYNs of any
/// further connection, as a host behind a dropping firewall does.
struct full_backlog {
  uint16_t port = 0;
  int listener = listen_on_loopback(port, 0);
  int filler = listener >= 0 ? connect_loopback(port) : -1;

  ~full_backlog() {
    if (filler >= 0)
      ::close(filler);
    if (listener >= 0)
      ::close(listener);
  }

  /// Accepts (and closes) the filler: the next SYN gets in.
  void make_room() {
    int fd = ::accept(listener, nullptr, nullptr);
    if (fd >= 0)
      ::close(fd);
  }
};

/// Connections to 127.0.0.1:`port` in SYN_SENT (/proc/net/tcp, state 02).
int syn_sent_to(uint16_t port) {
  std::ifstream in{"/proc/net/tcp"};
  std::string line;
  std::getline(in, line); // the header
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream fields{line};
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    auto colon = remote.find(':');
    if (state == "02" && colon != std::string::npos
        && std::stoul(remote.substr(colon + 1), nullptr, 16) == port)
      ++n;
  }
  return n;
}

/// Milliseconds since `start` (Catch prints a count, not a duration).
int64_t ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now()
                                                               - start)
    .count();
}

struct timed_ping {
  caf::expected<node_info> result;
  int64_t took_ms;
};

timed_ping ping_timed(session& s) {
  auto start = std::chrono::steady_clock::now();
  auto r = s.ping("ps", 0);
  return {std::move(r), ms_since(start)};
}

} // namespace

// Catches a ping's timeout that names the session's request timeout (20 s
// here) instead of the wait the caller gave it, or words that do not say
// which wait ran out and for whom.
TEST_CASE("a ping of a stopped node fails after the ping's own timeout and names the task and "
          "that timeout",
          "[connect][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"ps", 1}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 20s;
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:ps/task:0", so));
  REQUIRE(value_of(s.ping("ps", 0)).job == "ps"); // connected: what runs out below is the ping
  REQUIRE(pc->signal("ps", 0, SIGSTOP));
  auto start = std::chrono::steady_clock::now();
  auto r = s.ping("ps", 0, 500ms);
  auto took = ms_since(start);
  pc->signal("ps", 0, SIGCONT);
  REQUIRE_FALSE(r);
  auto text = describe(r.error());
  INFO(text);
  CHECK(is(r.error(), af_error::timeout));
  CHECK(text.find("ping of /job:ps/task:0 at " + pc->spec().address("ps", 0)->to_string()
                  + " got no answer within 500 ms")
        != std::string::npos);
  CHECK(text.find("20000") == std::string::npos);
  CHECK(took >= 450);
  CHECK(took < 10000);
  // After SIGCONT the node answers again.
  CHECK(value_of(s.ping("ps", 0)).job == "ps");
}

// Catches "unreachable: cannot reach ...: unreachable: Connection refused":
// the TCP connect's error was described with its code and wrapped in another
// error of the same code.
TEST_CASE("a connect to a port where nothing listens says unreachable once and names the task "
          "and address",
          "[connect]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  for (std::string host : {"127.0.0.1", "localhost"}) {
    auto address = host + ":" + std::to_string(free_loopback_port());
    auto s = value_of(session::make(sys, one_ps_at(address), "/job:ps/task:0",
                                    with_connect_timeout(3000ms)));
    auto [r, took] = ping_timed(s);
    REQUIRE_FALSE(r);
    auto text = describe(r.error());
    INFO(text);
    CHECK(is(r.error(), af_error::unreachable));
    CHECK(occurrences(text, "unreachable") == 1);
    CHECK(text.find("cannot reach /job:ps/task:0 at " + address) != std::string::npos);
    CHECK(text.find("connection refused") != std::string::npos);
    CHECK(took < 3000);
  }
  // A name that does not resolve: said once too, naming the name.
  auto s = value_of(session::make(sys, one_ps_at("no-such-host.invalid:1"), "/job:ps/task:0",
                                  with_connect_timeout(3000ms)));
  auto [r, took] = ping_timed(s);
  REQUIRE_FALSE(r);
  auto text = describe(r.error());
  INFO(text);
  CHECK(occurrences(text, "unreachable") == 1);
  CHECK(text.find("'no-such-host.invalid'") != std::string::npos);
  CHECK(took < 3500); // a slow resolver is cut at the connect's deadline
}

// Catches a connect whose phases each get the whole connect_timeout: a TCP
// connection that gets in late (its first SYN dropped, the retransmission
// after ~1 s accepted) and then no handshake took ~1 s + connect_timeout.
TEST_CASE("a connect fails within connect_timeout, whichever of its phases is slow, naming the "
          "address and the timeout",
          "[connect]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  full_backlog blackhole;
  REQUIRE(blackhole.filler >= 0);
  auto address = "127.0.0.1:" + std::to_string(blackhole.port);

  SECTION("no TCP connection at all: every SYN is dropped") {
    auto s = value_of(session::make(sys, one_ps_at(address), "/job:ps/task:0",
                                    with_connect_timeout(1000ms)));
    auto [r, took] = ping_timed(s);
    REQUIRE_FALSE(r);
    auto text = describe(r.error());
    INFO(text);
    CHECK(text.find("cannot reach /job:ps/task:0 at " + address) != std::string::npos);
    CHECK(text.find("not accepted within 1000 ms") != std::string::npos);
    CHECK(took >= 950);
    CHECK(took < 1500);
  }

  SECTION("the TCP connection gets in late, then no handshake comes") {
    auto s = value_of(session::make(sys, one_ps_at(address), "/job:ps/task:0",
                                    with_connect_timeout(1500ms)));
    auto start = std::chrono::steady_clock::now();
    auto ping = std::async(std::launch::async, [&] { return s.ping("ps", 0); });
    // Its first SYN was dropped; the kernel sends it again after ~1 s, and
    // this time there is room for it.
    bool dropped = eventually([&] { return syn_sent_to(blackhole.port) > 0; }, 5s);
    blackhole.make_room();
    REQUIRE(ping.wait_for(10s) == std::future_status::ready);
    auto r = ping.get();
    auto took = ms_since(start);
    REQUIRE(dropped); // the session's SYN, waiting in SYN_SENT
    REQUIRE_FALSE(r);
    auto text = describe(r.error());
    INFO(text);
    CHECK(text.find("cannot reach /job:ps/task:0 at " + address) != std::string::npos);
    CHECK(text.find("did not complete the handshake within 1500 ms") != std::string::npos);
    CHECK(took >= 1400);
    CHECK(took < 1900);
  }
}
