// [connect]: what a session's connect and ping say when the node does not
// answer, and how long they take: one deadline for the whole connect (name
// lookup, TCP, handshakes), the ping's own timeout named in its error, and
// each error's code said once.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "caf/all.hpp"

#include "net/data_plane.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "config/cluster_spec.hpp"
#include "config/loopback.hpp"
#include "messages/error.hpp"
#include "certs.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "temp_dir.hpp"
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

/// A listener on 127.0.0.1 that never accepts: the kernel completes the
/// TCP connection (the backlog has room) and nothing ever answers on it, as
/// a node stopped before its handshake.
struct silent_listener {
  uint16_t port = 0;
  int listener = listen_on_loopback(port, 16);
  ~silent_listener() {
    if (listener >= 0)
      ::close(listener);
  }
};

/// Connections to 127.0.0.1:`port` in a state of /proc/net/tcp ("01":
/// established, "02": SYN_SENT).
int connections_to(uint16_t port, const std::string& wanted_state) {
  std::ifstream in{"/proc/net/tcp"};
  std::string line;
  std::getline(in, line); // the header
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream fields{line};
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    auto colon = remote.find(':');
    if (state == wanted_state && colon != std::string::npos
        && std::stoul(remote.substr(colon + 1), nullptr, 16) == port)
      ++n;
  }
  return n;
}

/// This process's CPU time (user + system), in milliseconds.
double cpu_ms() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto ms = [](const timeval& tv) { return tv.tv_sec * 1000.0 + tv.tv_usec / 1000.0; };
  return ms(ru.ru_utime) + ms(ru.ru_stime);
}

/// Client options with a heartbeat much shorter than the connect timeouts
/// below, and a connection_timeout shorter than them too: neither may end
/// a connect before its connect_timeout.
node_options fast_heartbeat() {
  node_options o;
  o.heartbeat_ms = 100;
  o.connection_timeout_ms = 300;
  return o;
}

} // namespace

// Catches a connect that CAF's BASP broker closed at its first heartbeat
// tick (its connection context had never been seen: last_seen at the
// clock's epoch), long before connect_timeout, while the error still said
// "within <connect_timeout> ms" (issue 11, finding #1: 1.1 s of 5 s with the
// default heartbeat_ms).
TEST_CASE("a connect to a node that never answers its handshake fails at connect_timeout, not at "
          "the first heartbeat",
          "[connect]") {
  system_config cfg{fast_heartbeat()};
  caf::actor_system sys{cfg};
  silent_listener silent;
  REQUIRE(silent.listener >= 0);
  auto address = "127.0.0.1:" + std::to_string(silent.port);
  auto s = value_of(session::make(sys, one_ps_at(address), "/job:ps/task:0",
                                  with_connect_timeout(1500ms)));
  auto [r, took] = ping_timed(s);
  REQUIRE_FALSE(r);
  auto text = describe(r.error());
  INFO(text);
  CHECK(text.find("did not complete the handshake within 1500 ms") != std::string::npos);
  CHECK(took >= 1400); // 15 heartbeats and 5 connection_timeouts went by
  CHECK(took < 2500);
}

// The same bug seen from a real node: one stopped for a few heartbeats (a
// GC pause, a debugger, an overloaded host) but less than connect_timeout
// was refused; after the fix it is connected once it goes on.
TEST_CASE("a node stopped for less than connect_timeout while a session connects is connected "
          "once it goes on",
          "[connect][processes]") {
  auto opts = fast_heartbeat();
  auto pc = value_of(process_cluster::start({{"ps", 1}}, opts));
  cluster_client c{opts};
  auto port = pc->spec().address("ps", 0)->port;
  REQUIRE(pc->signal("ps", 0, SIGSTOP));
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:ps/task:0",
                                  with_connect_timeout(6000ms)));
  auto start = std::chrono::steady_clock::now();
  auto ping = std::async(std::launch::async, [&] { return s.ping("ps", 0); });
  // The connect has started: its TCP connection is in the stopped node's
  // backlog (the kernel accepts it for the node).
  bool connecting = eventually([&] { return connections_to(port, "01") > 0; }, 5s);
  // Ten heartbeats of the client later, the connect is still waiting (it
  // was failed at the first one).
  auto pending = ping.wait_for(1000ms);
  REQUIRE(pc->signal("ps", 0, SIGCONT));
  REQUIRE(ping.wait_for(15s) == std::future_status::ready);
  auto r = ping.get();
  auto took = ms_since(start);
  CHECK(connecting);
  CHECK(pending == std::future_status::timeout);
  if (!r)
    FAIL_CHECK(describe(r.error()));
  else
    CHECK(r->job == "ps");
  CHECK(took >= 1000);
}

// Catches the TLS connect that spun a core while the node did not answer
// its handshake: after the ClientHello, a write of BASP's bytes that
// OpenSSL answered with "want read" was reported as done with 0 bytes, so
// CAF asked for the next write on an always-writable socket at once (issue
// 11, finding #4: user 1.9 s + sys 3.4 s over a 5 s connect). Wall and CPU
// time of the process over the connect, TLS against plaintext in the same
// run; the bound is a correctness one (a spinning connect uses ~100%).
TEST_CASE("a TLS connect to a node that does not answer its handshake does not spin a core",
          "[connect][tls]") {
  temp_dir dir;
  silent_listener silent;
  REQUIRE(silent.listener >= 0);
  auto address = "127.0.0.1:" + std::to_string(silent.port);
  auto config = dir / "cluster.toml";
  std::string cluster_table = "[cluster]\nps = [\"" + address + "\"]\n";
  write_file(config, cluster_table);
  write_file(config, cluster_table + "\n" + make_certs(config));
  auto loaded = value_of(load_cluster_config(config));
  auto sec = value_of(security_for(loaded.security, "client"));
  struct usage {
    int64_t wall_ms;
    double cpu_ms;
  };
  auto connect = [&](const security_options& with) {
    system_config cfg{node_options{}, with};
    caf::actor_system sys{cfg};
    auto o = with_connect_timeout(2000ms);
    o.security = with;
    auto s = value_of(session::make(sys, one_ps_at(address), "/job:ps/task:0", o));
    auto cpu0 = cpu_ms();
    auto [r, took] = ping_timed(s);
    auto cpu = cpu_ms() - cpu0;
    REQUIRE_FALSE(r);
    INFO(describe(r.error()));
    CHECK(describe(r.error()).find("did not complete the handshake within 2000 ms")
          != std::string::npos);
    return usage{took, cpu};
  };
  auto tls = connect(sec);
  auto plain = connect(security_options{});
  auto share = [](const usage& u) { return u.cpu_ms / static_cast<double>(std::max<int64_t>(1, u.wall_ms)); };
  std::printf("connect to a silent node, CPU time over wall time: TLS %.1f ms / %lld ms (%.3f), "
              "plaintext %.1f ms / %lld ms (%.3f), TLS/plaintext CPU ratio %.2f\n",
              tls.cpu_ms, static_cast<long long>(tls.wall_ms), share(tls), plain.cpu_ms,
              static_cast<long long>(plain.wall_ms), share(plain),
              tls.cpu_ms / std::max(0.1, plain.cpu_ms));
  CHECK(tls.wall_ms >= 1900);
  CHECK(share(tls) < 0.5);
}

/// A listener on 127.0.0.1 that accepts each connection and closes it at
/// once, before a byte: what a node out of file descriptors does on its CAF
/// port (it gives up a spare descriptor to accept and close).
struct closing_listener {
  uint16_t port = 0;
  int listener = listen_on_loopback(port, 16);
  std::atomic<bool> stop{false};
  std::thread closer{[this] {
    while (!stop.load() && listener >= 0) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0)
        continue;
      int fd = ::accept(listener, nullptr, nullptr);
      if (fd >= 0)
        ::close(fd);
    }
  }};
  ~closing_listener() {
    stop = true;
    closer.join();
    if (listener >= 0)
      ::close(listener);
  }
};

// Catches (issue 22) the hint of a connect the node closed before any byte
// of a handshake, as a node out of file descriptors does: "is the node
// running with [security]?" sent an operator to the wrong place.
TEST_CASE("a connect the node closes at once says so, not only that it may need [security]",
          "[connect][tls]") {
  temp_dir dir;
  closing_listener closing;
  REQUIRE(closing.listener >= 0);
  auto address = "127.0.0.1:" + std::to_string(closing.port);
  auto config = dir / "cluster.toml";
  std::string cluster_table = "[cluster]\nps = [\"" + address + "\"]\n";
  write_file(config, cluster_table);
  write_file(config, cluster_table + "\n" + make_certs(config));
  auto loaded = value_of(load_cluster_config(config));
  auto sec = value_of(security_for(loaded.security, "client"));
  bool tls = false; // the plaintext client first, then the TLS one
  for (const auto& with : {security_options{}, sec}) {
    system_config cfg{node_options{}, with};
    caf::actor_system sys{cfg};
    auto o = with_connect_timeout(5000ms);
    o.security = with;
    auto s = value_of(session::make(sys, one_ps_at(address), "/job:ps/task:0", o));
    auto [r, took] = ping_timed(s);
    REQUIRE_FALSE(r);
    auto text = describe(r.error());
    INFO(text);
    CHECK(text.find("cannot reach /job:ps/task:0 at " + address) != std::string::npos);
    CHECK(text.find("the node closed the connection before") != std::string::npos);
    CHECK(text.find("out of file descriptors") != std::string::npos);
    // Without TLS a node with [security] looks the same, so both are named;
    // a TLS client that got no byte back does not blame [security].
    CHECK((text.find("[security]") == std::string::npos) == tls);
    CHECK(took < 4000); // at once, not at connect_timeout
    tls = true;
  }
}

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
    bool dropped = eventually([&] { return connections_to(blackhole.port, "02") > 0; }, 5s);
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

namespace {

void ignore_signal(int) {}

/// Sends SIGUSR1, whose handler does nothing and does not restart system
/// calls, to `thread` ten times, 20 ms apart, unless `done` says it has
/// returned, as libFuzzer's timer or a profiler's does to a whole process:
/// each blocking call it is in fails with EINTR. The signals that were sent.
template <class Done>
int interrupt(pthread_t thread, Done done) {
  int sent = 0;
  for (; sent < 10 && !done(); ++sent) {
    ::pthread_kill(thread, SIGUSR1);
    eventually(done, 20ms); // the pace, cut short when it returns
  }
  return sent;
}

} // namespace

// Catches a connect that reports a signal's EINTR as the peer's refusal:
// "the data plane refused a connection: Interrupted system call" (fuzz CI,
// f24bbe6), where libFuzzer's SIGALRM hit a blocking connect to a data plane
// whose accept queue was full. The connects here wait in SYN_SENT (a full
// backlog) while signals arrive, and must then connect when room is made.
TEST_CASE("a connect interrupted by signals while its SYN waits connects once there is room",
          "[connect]") {
  // The handler (no SA_RESTART) for this test only, put back however it ends.
  struct handler_scope {
    struct sigaction old {};
    bool installed = false;
    handler_scope() {
      struct sigaction sa {};
      sa.sa_handler = ignore_signal;
      installed = ::sigaction(SIGUSR1, &sa, &old) == 0;
    }
    ~handler_scope() {
      if (installed)
        ::sigaction(SIGUSR1, &old, nullptr);
    }
  } handler;
  REQUIRE(handler.installed);
  full_backlog blackhole;
  REQUIRE(blackhole.filler >= 0);

  auto check = [&](auto connect) {
    std::promise<pthread_t> self;
    auto me = self.get_future();
    auto result = std::async(std::launch::async, [&] {
      self.set_value(::pthread_self());
      return connect();
    });
    auto thread = me.get();
    REQUIRE(eventually([&] { return connections_to(blackhole.port, "02") > 0; }, 5s));
    int sent = interrupt(thread, [&] { return result.wait_for(0s) == std::future_status::ready; });
    CHECK(sent == 10); // all while it waited: it did not give up on the first
    blackhole.make_room();
    REQUIRE(result.wait_for(10s) == std::future_status::ready);
    return result.get();
  };

  SECTION("the data plane's channel") {
    auto ch = check([&] {
      return data_channel::connect("127.0.0.1", blackhole.port, "a data plane", 8s);
    });
    INFO((ch ? std::string{"connected"} : describe(ch.error())));
    CHECK(ch);
  }

  SECTION("the loopback helper of tests and benchmarks") {
    auto fd = check([&] { return connect_loopback(blackhole.port); });
    INFO(std::strerror(errno));
    CHECK(fd >= 0);
    if (fd >= 0)
      ::close(fd);
  }
}

TEST_CASE("free_loopback_port picks bindable ports below the kernel's ephemeral range, so that no "
          "port 0 bind or outgoing connection can take one before its server binds it, and none of "
          "its last 256 again",
          "[connect][loopback]") {
  // Catches: a test's reserved port picked by a bind to port 0, which the
  // kernel draws from the ephemeral range, where any process's next bind to
  // port 0 (a node's data plane) or outgoing connection may be given it
  // before the node meant for it binds it; and a port picked twice by one
  // test for two nodes of one config (a pick holds no port), which every
  // node refuses.
  std::ifstream f{"/proc/sys/net/ipv4/ip_local_port_range"};
  int low = 0;
  REQUIRE(static_cast<bool>(f >> low));
  if (low - 10000 < 4096) {
    WARN("skipped: the ephemeral range starts at " << low
                                                    << ": no room below it, so free_loopback_port "
                                                       "binds to port 0");
    return;
  }
  std::vector<uint16_t> picked;
  for (int i = 0; i < 1000; ++i) {
    auto port = free_loopback_port();
    INFO("port " << port << " (ephemeral range from " << low << ")");
    REQUIRE(port >= 10000);
    REQUIRE(port < low);
    picked.push_back(port);
    if (i % 20 == 0) { // it was free: bind it now
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      auto addr = sockaddr_in{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(port);
      CHECK(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
      close(fd);
    }
  }
  // Drawn at random, and none again within 256 picks (at random alone,
  // about 11 repeats would be expected among these).
  size_t repeats = 0;
  for (size_t i = 0; i < picked.size(); ++i)
    for (size_t j = i + 1; j < picked.size() && j < i + 256; ++j)
      repeats += picked[i] == picked[j];
  CHECK(repeats == 0);
  CHECK(std::set<uint16_t>(picked.begin(), picked.end()).size() > 900);
}

TEST_CASE("free_loopback_port repeats none of its last 256 picks on a host whose ephemeral range "
          "leaves no room below it, where the kernel picks",
          "[connect][loopback]") {
  // Catches: on such a host (ip_local_port_range "1024 65000", or
  // "10000 20000") the picks came from binds to port 0 unrecorded, which
  // the kernel repeats about 20 times in 1,000 picks within 256 of each other:
  // a test's four ports for one config then held one twice now and then.
  std::vector<uint16_t> picked;
  for (int i = 0; i < 1000; ++i) {
    auto port = detail::free_loopback_port(1024);
    REQUIRE(port != 0);
    picked.push_back(port);
  }
  size_t repeats = 0;
  for (size_t i = 0; i < picked.size(); ++i)
    for (size_t j = i + 1; j < picked.size() && j < i + 256; ++j)
      repeats += picked[i] == picked[j];
  CHECK(repeats == 0);
}
