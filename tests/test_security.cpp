// [security]: mutual TLS on a node's CAF port, who is refused, the checks at
// start-up, the plaintext guard rails, a node's exit code, the cap on a
// stranger's first BASP message and the supervisor of --restart-on-failure.
// Nodes run as real actorflow-node processes on 127.0.0.1, so that what they
// log and how they exit is what an operator sees.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <vector>

#include <openssl/ssl.h>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf/openssl/manager.hpp"

#include "actors/node.hpp"
#include "net/tls.hpp"
#include "config/loopback.hpp"
#include "certs.hpp"
#include "scenarios.hpp"
#include "temp_dir.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

/// A one-task cluster config (ps on 127.0.0.1, a free port) in `dir`, with
/// certificates made by actorflow-certs under dir/certs and [security]
/// pointing at them when `secure`.
struct test_cluster {
  temp_dir dir;
  uint16_t port = free_loopback_port();
  std::string config = dir / "cluster.toml";
  std::string cluster_table;
  std::string security_table; ///< what actorflow-certs printed (secure only)

  explicit test_cluster(bool secure, const std::vector<std::string>& certs_args = {}) {
    cluster_table = "[cluster]\nps = [\"127.0.0.1:" + std::to_string(port)
                    + "\"]\n\n[node]\nthreads = 2\n";
    write_file(config, cluster_table);
    if (!secure)
      return;
    std::vector<std::string> argv{ACTORFLOW_CERTS_BINARY, "--config", config};
    argv.insert(argv.end(), certs_args.begin(), certs_args.end());
    auto made = run_command(argv, 60s);
    INFO(made.output);
    REQUIRE(made.exit_code == 0);
    // What it prints is what a user pastes.
    auto at = made.output.find("[security]");
    REQUIRE(at != std::string::npos);
    security_table = made.output.substr(at);
    write_file(config, cluster_table + "\n" + security_table);
  }

  /// The config again, with `lines` added to its [node] table.
  void add_node_lines(const std::string& lines) {
    write_file(config, cluster_table + lines + (security_table.empty() ? "" : "\n" + security_table));
  }

  cluster_spec spec() const { return value_of(load_cluster_config(config)).cluster; }

  std::vector<std::string> node_args() const {
    return {ACTORFLOW_NODE_BINARY, "--config", config, "--job", "ps", "--task", "0"};
  }
};

/// The [security] of `config` as a client reads it.
security_options client_security(const std::string& config) {
  auto cfg = value_of(load_cluster_config(config));
  return value_of(security_for(cfg.security, "client"));
}

session_options client_options(const security_options& sec, std::chrono::milliseconds t = 5000ms) {
  session_options o;
  o.timeout = t;
  o.connect_timeout = t;
  o.security = sec;
  return o;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

/// The pids in the node's "ready" lines, in order.
std::vector<pid_t> ready_pids(const std::string& output) {
  std::vector<pid_t> out;
  std::regex ready{R"(actorflow-node ready: .*pid (\d+))"};
  for (std::sregex_iterator it{output.begin(), output.end(), ready}, end; it != end; ++it)
    out.push_back(static_cast<pid_t>(std::stol((*it)[1])));
  return out;
}

/// Resident memory of `pid` in KiB (VmRSS), -1 if unknown.
long rss_kib(pid_t pid) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stol(line.substr(6));
  return -1;
}

/// Whether the peer closes `fd` within `limit` (what it sends is read and
/// dropped: BASP's server handshake, a TLS alert).
bool closed_within(int fd, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0)
      continue;
    char buf[4096];
    if (::recv(fd, buf, sizeof(buf), 0) <= 0)
      return true;
  }
  return false;
}

/// The node actor published at 127.0.0.1:`port`, through CAF's own
/// middleman, as any peer's program would reach it.
node_actor node_handle(caf::actor_system& sys, uint16_t port) {
  auto h = sys.middleman().remote_actor<node_actor>("127.0.0.1", port);
  INFO((h ? std::string{} : sys.render(h.error())));
  REQUIRE(h);
  return *h;
}

/// Assigns [3, 4] to a new variable on the ps and reads it back.
void assign_and_read(session& s) {
  auto v = value_of(s.variable("secured", {2}, initializer::constant(2)));
  require_ok(s.initialize());
  auto assigned = s.assign(v, s.constant(tensor::from_values<float>({2}, {3.0f, 4.0f})));
  value_of(s.run(assigned));
  auto read = value_of(s.run(v));
  CHECK(read.values<float>() == std::vector<float>{3.0f, 4.0f});
}

/// A stranger's connection (`stranger`: its address) was `closed` at the
/// node's 500 ms handshake deadline, not at once (`took`), and the node's
/// log names it.
void check_closed_at_deadline(background_process& node, bool closed,
                              std::chrono::steady_clock::duration took,
                              const std::string& stranger) {
  INFO(node.output());
  CHECK(closed);
  CHECK(took >= 450ms); // the deadline, not at once
  REQUIRE(node.wait_for("no handshake within 500 ms", 10s));
  std::smatch m;
  auto out = node.output();
  REQUIRE(std::regex_search(out, m, std::regex{R"(closed (.*) on the CAF port: no handshake)"}));
  CHECK(m[1] == stranger);
}

} // namespace

TEST_CASE("a node with [security] serves a client with a certificate of the cluster CA",
          "[security]") {
  test_cluster c{true};
  background_process node{c.node_args()};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));
  CHECK(node.output().find("mutual TLS") != std::string::npos);
  CHECK(node.output().find("unauthenticated") == std::string::npos);
  INFO(node.output());
  auto sec = client_security(c.config);
  system_config cfg{node_options{}, sec};
  caf::actor_system sys{cfg};
  auto s = value_of(session::make(sys, c.spec(), "/job:ps/task:0", client_options(sec)));
  assign_and_read(s);
  CHECK(node.output().find("refused") == std::string::npos);
}

TEST_CASE("a plaintext client and a client of another CA are refused before any request, "
          "and the node logs who and why",
          "[security]") {
  test_cluster c{true};
  background_process node{c.node_args()};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));
  auto spec = c.spec();

  SECTION("plaintext: no TLS at all") {
    system_config cfg{node_options{}};
    caf::actor_system sys{cfg};
    auto s = value_of(session::make(sys, spec, "/job:ps/task:0", client_options({}, 3000ms)));
    auto start = std::chrono::steady_clock::now();
    auto info = s.ping("ps", 0);
    REQUIRE_FALSE(info);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    CHECK(describe(info.error()).find("cannot reach /job:ps/task:0") != std::string::npos);
    REQUIRE(node.wait_for("refused 127.0.0.1:", 10s));
    CHECK(node.output().find("TLS handshake failed") != std::string::npos);
    // The data plane of the same node: a plaintext frame gets no answer but
    // a refusal (start_node gave it the node's TLS context).
    std::smatch m;
    auto out = node.output();
    REQUIRE(std::regex_search(out, m, std::regex{R"(data plane port (\d+))"}));
    auto data_port = static_cast<uint16_t>(std::stoi(m[1]));
    auto ch = data_channel::connect("127.0.0.1", data_port, "/job:ps/task:0", 3000ms);
    if (ch) {
      auto read = (*ch)->call(var_op::read, "anything", nullptr, true);
      CHECK_FALSE(read);
    }
    CHECK(node.wait_for("data plane: refused 127.0.0.1", 10s));
  }

  SECTION("a certificate of another CA") {
    // Another cluster's CA and client certificate, trusting our CA so that
    // it is the node that refuses, not the client.
    temp_dir other;
    write_file(other / "cluster.toml", c.cluster_table);
    auto made = run_command({ACTORFLOW_CERTS_BINARY, "--config", other / "cluster.toml"}, 60s);
    REQUIRE(made.exit_code == 0);
    auto sec = client_security(c.config);
    sec.cert_file = other / "certs/client.pem";
    sec.key_file = other / "certs/client.key";
    system_config cfg{node_options{}, sec};
    caf::actor_system sys{cfg};
    // A session checks its own files first and names the mismatch ...
    auto s = value_of(session::make(sys, spec, "/job:ps/task:0", client_options(sec, 3000ms)));
    auto info = s.ping("ps", 0);
    REQUIRE_FALSE(info);
    CHECK(describe(info.error()).find("is not signed by the CA") != std::string::npos);
    // ... so go around it, as a stranger's own program would: CAF's TLS
    // connect with that certificate. The node refuses it.
    caf::scoped_actor self{sys};
    caf::error refused;
    self->request(sys.openssl_manager().actor_handle(), 5s, caf::connect_atom::value,
                  std::string{"127.0.0.1"}, c.port)
      .receive([&](caf::node_id&, caf::strong_actor_ptr&, std::set<std::string>&) {},
               [&](caf::error& e) { refused = std::move(e); });
    CHECK(refused == caf::sec::disconnect_during_handshake);
    REQUIRE(node.wait_for("refused 127.0.0.1:", 10s));
    INFO(node.output());
    // OpenSSL's reason: the client's certificate does not verify.
    CHECK(node.output().find("its certificate was refused (unable to get local issuer "
                             "certificate)")
          != std::string::npos);
  }

  // The node serves on: a member of the cluster still gets in.
  auto sec = client_security(c.config);
  system_config cfg{node_options{}, sec};
  caf::actor_system sys{cfg};
  auto s = value_of(session::make(sys, spec, "/job:ps/task:0", client_options(sec)));
  CHECK(value_of(s.ping("ps", 0)).job == "ps");
}

// Catches actorflow-certs reading the files it is to make: a config with
// the [security] lines pasted first was refused ("cannot read certs/ca.pem").
TEST_CASE("actorflow-certs makes the files that a config's [security] already names",
          "[security]") {
  temp_dir dir;
  std::string config = dir / "cluster.toml";
  write_file(config, "[cluster]\nps = [\"127.0.0.1:1\"]\n\n[security]\nca = \"certs/ca.pem\"\n"
                "certificate = \"certs/{name}.pem\"\nkey = \"certs/{name}.key\"\n\n[node]\n"
                "threads = 1\n");
  REQUIRE_FALSE(load_cluster_config(config)); // the files are not there yet
  auto made = run_command({ACTORFLOW_CERTS_BINARY, "--config", config}, 60s);
  INFO(made.output);
  CHECK(made.exit_code == 0);
  auto cfg = load_cluster_config(config);
  REQUIRE(cfg);
  CHECK(cfg->security.enabled());
  CHECK(cfg->node.threads == 1); // the tables after [security] were read too
}

TEST_CASE("a wrong key passphrase is an error naming the key file, at start, not a hang",
          "[security]") {
  temp_dir pass;
  write_file(pass / "right.pass", "correct horse\n");
  write_file(pass / "wrong.pass", "battery staple\n");
  test_cluster c{true, {"--passphrase-file", pass / "right.pass"}};
  auto text = [&] {
    std::ifstream in{c.config};
    std::stringstream buf;
    buf << in.rdbuf();
    return buf.str();
  }();
  auto at = text.find("passphrase_file");
  REQUIRE(at != std::string::npos);
  write_file(c.config, text.substr(0, at) + "passphrase_file = \"" + pass / "wrong.pass" + "\"\n");

  auto start = std::chrono::steady_clock::now();
  auto res = run_command(c.node_args(), 30s);
  INFO(res.output);
  CHECK(res.exit_code == 2);
  CHECK(std::chrono::steady_clock::now() - start < 20s);
  CHECK(res.output.find("ps-0.key") != std::string::npos);
  CHECK(res.output.find("actorflow-node ready") == std::string::npos);

  // A client with the wrong passphrase: the same, before CAF reads the key.
  auto sec = client_security(c.config);
  system_config cfg{node_options{}, sec};
  caf::actor_system sys{cfg};
  auto s = value_of(session::make(sys, c.spec(), "/job:ps/task:0", client_options(sec, 3000ms)));
  auto client_start = std::chrono::steady_clock::now();
  auto info = s.ping("ps", 0);
  REQUIRE_FALSE(info);
  CHECK(describe(info.error()).find("client.key") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - client_start < 5s);

  // And the right one starts.
  write_file(pass / "wrong.pass", "correct horse\n");
  background_process node{c.node_args()};
  CHECK(node.wait_for("actorflow-node ready", 30s));
}

// Catches a node that starts with another task's certificate (the files of
// ps 1 given to ps 0): it said "ready ... mutual TLS" and then every session
// that dialled it was refused by the name check, far from the cause.
TEST_CASE("a node whose certificate is another task's refuses to start, naming both tasks and "
          "the file",
          "[security]") {
  temp_dir dir;
  auto config = dir / "cluster.toml";
  std::string cluster = "[cluster]\nps = [\"127.0.0.1:" + std::to_string(free_loopback_port())
                        + "\", \"127.0.0.1:" + std::to_string(free_loopback_port()) + "\"]\n";
  write_file(config, cluster);
  auto security = make_certs(config);
  REQUIRE(security.find("{name}") != std::string::npos);
  // ps 0 with ps 1's certificate and key.
  auto swapped = std::regex_replace(security, std::regex{R"(\{name\})"}, "ps-1");
  write_file(config, cluster + "\n" + swapped);
  auto res = run_command({ACTORFLOW_NODE_BINARY, "--config", config, "--job", "ps", "--task", "0"},
                         30s);
  INFO(res.output);
  CHECK(res.exit_code == 2);
  CHECK(res.output.find("actorflow-node ready") == std::string::npos);
  CHECK(res.output.find("ps-1.pem") != std::string::npos);
  CHECK(res.output.find("is /job:ps/task:1's") != std::string::npos);
  CHECK(res.output.find("the certificate made for /job:ps/task:0") != std::string::npos);
  // Its own files: it starts.
  write_file(config, cluster + "\n" + security);
  background_process node{{ACTORFLOW_NODE_BINARY, "--config", config, "--job", "ps", "--task", "0"}};
  CHECK(node.wait_for("actorflow-node ready", 30s));
}

TEST_CASE("[security] needs ca, certificate and key together, and insecure contradicts them",
          "[security][config]") {
  test_cluster c{true};
  auto base = c.cluster_table + "[security]\n";
  auto partial = parse_cluster_toml(base + "certificate = \"" + c.dir / "certs/ps-0.pem" + "\"\n",
                                    c.config);
  REQUIRE_FALSE(partial);
  CHECK(describe(partial.error()).find("missing: ca, key") != std::string::npos);
  auto both = parse_cluster_toml(base + "ca = \"certs/ca.pem\"\ncertificate = \"certs/ps-0.pem\"\n"
                                         "key = \"certs/ps-0.key\"\ninsecure = true\n",
                                 c.config);
  REQUIRE_FALSE(both);
  CHECK(describe(both.error()).find("insecure = true and certificates contradict") != std::string::npos);
  // Relative paths are the config folder's, whatever the working directory.
  auto ok = value_of(parse_cluster_toml(base + "ca = \"certs/ca.pem\"\ncertificate = \"certs/{name}.pem\"\n"
                                               "key = \"certs/{name}.key\"\n",
                                        c.config));
  CHECK(ok.security.ca_file == c.dir / "certs/ca.pem");
  auto ps = value_of(security_for(ok.security, "ps-0"));
  CHECK(ps.cert_file == c.dir / "certs/ps-0.pem");
  auto nobody = security_for(ok.security, "worker-7");
  REQUIRE_FALSE(nobody);
  CHECK(describe(nobody.error()).find("worker-7.pem") != std::string::npos);
}

TEST_CASE("without [security] a node warns once and refuses a non-loopback address",
          "[security]") {
  CHECK(is_loopback_host("127.0.0.1"));
  CHECK(is_loopback_host("localhost"));
  CHECK(is_loopback_host("::1"));
  CHECK_FALSE(is_loopback_host(""));
  CHECK_FALSE(is_loopback_host("0.0.0.0"));
  CHECK_FALSE(is_loopback_host("10.1.2.3"));

  test_cluster c{false};
  std::vector<std::string> addresses{"0.0.0.0"};
  // The machine's own non-loopback address too, when it has one.
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (auto* i = ifs; i != nullptr; i = i->ifa_next)
      if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET) {
        char text[INET_ADDRSTRLEN];
        auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
        if (std::string{text}.rfind("127.", 0) != 0) {
          addresses.push_back(text);
          break;
        }
      }
    ::freeifaddrs(ifs);
  }
  for (const auto& address : addresses) {
    auto args = c.node_args();
    args.push_back("--bind");
    args.push_back(address);
    auto res = run_command(args, 30s);
    INFO(address << ": " << res.output);
    CHECK(res.exit_code == 2);
    CHECK(res.output.find("refuses to listen on '" + address + "' without [security]")
          != std::string::npos);
    CHECK(res.output.find("insecure = true") != std::string::npos);
  }

  background_process node{c.node_args()};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));
  node.signal(SIGTERM);
  CHECK(node.wait_exit(10s) == 0);
  INFO(node.output());
  CHECK(count(node.output(), "unauthenticated") == 1);
  CHECK(node.output().find("plaintext") != std::string::npos);
}

TEST_CASE("a node that ends by a failure exits 1 and says why, asked to stop, it exits 0",
          "[security][node]") {
  test_cluster c{false};
  for (auto [reason, code] : {std::pair<caf::exit_reason, int>{caf::exit_reason::unhandled_exception, 1},
                              {caf::exit_reason::user_shutdown, 0}}) {
    background_process node{c.node_args()};
    REQUIRE(node.wait_for("actorflow-node ready", 30s));
    system_config cfg{node_options{}};
    caf::actor_system sys{cfg};
    // Any peer can send the node an exit message (docs/security.md: no
    // authorization between members); one with an error reason is how an
    // actor's failure reaches it.
    caf::anon_send_exit(node_handle(sys, c.port), reason);
    auto exit_code = node.wait_exit(15s);
    INFO(node.output());
    REQUIRE(exit_code);
    CHECK(*exit_code == code);
    if (code == 1) {
      CHECK(node.output().find("the node failed") != std::string::npos);
      CHECK(node.output().find("unhandled_exception") != std::string::npos);
    } else {
      CHECK(node.output().find("stopped") != std::string::npos);
    }
  }
  // The failure of an actor the node is linked to, not an exit message to
  // the node itself: its CPU:0 executor ends with an error, and the link
  // takes the node down with that reason. Catches a node whose executors
  // are not linked to it, or whose exit handler does not stop it (or stops
  // it cleanly, exit 0) when one fails: it would serve on without a device.
  // Nothing a peer sends can make an executor throw (issue 11 §2: that
  // would be a bug to fix), so the executor is ended as any peer may end
  // an actor it has a handle of, by an exit message.
  background_process node{c.node_args()};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  auto h = node_handle(sys, c.port);
  caf::scoped_actor self{sys};
  executor_actor cpu0;
  std::string why;
  self->request(h, std::chrono::seconds{10}, executor_atom::value, std::string{"CPU:0"})
    .receive([&](executor_actor& e) { cpu0 = e; },
             [&](caf::error& err) { why = sys.render(err); });
  INFO("the node's CPU:0 executor: " << why);
  REQUIRE(cpu0);
  caf::anon_send_exit(cpu0, caf::exit_reason::unhandled_exception);
  auto exit_code = node.wait_exit(15s);
  INFO(node.output());
  REQUIRE(exit_code);
  CHECK(*exit_code == 1);
  CHECK(node.output().find("executor CPU:0 failed") != std::string::npos);
  CHECK(node.output().find("the node failed") != std::string::npos);
  CHECK(node.output().find("unhandled_exception") != std::string::npos);
}

TEST_CASE("a stranger's BASP header announcing 3 GiB is closed unread and the node's memory "
          "stays flat",
          "[security]") {
  test_cluster c{false};
  background_process node{c.node_args()};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));
  auto pid = ready_pids(node.output()).at(0);
  auto before = rss_kib(pid);
  REQUIRE(before > 0);

  int fd = connect_loopback(c.port);
  REQUIRE(fd >= 0);
  // BASP's 32-byte header in network order: a client handshake of BASP
  // version 3 whose payload is 3 GiB.
  unsigned char header[32] = {};
  header[0] = 0x01;                           // client_handshake
  uint32_t len = htonl(3u << 30);             // payload_len
  std::memcpy(header + 4, &len, 4);
  header[15] = 3;                             // operation_data: the version
  REQUIRE(::send(fd, header, sizeof(header), MSG_NOSIGNAL) == 32);
  // The node closes it: read (its own handshake) until the end, bounded.
  bool closed = closed_within(fd, 10s);
  ::close(fd);
  CHECK(closed);
  REQUIRE(node.wait_for("announces a message of 3221225472 bytes", 10s));
  auto after = rss_kib(pid);
  INFO("RSS before " << before << " KiB, after " << after << " KiB");
  CHECK(after - before < 16 * 1024);

  // And it serves on.
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  auto s = value_of(session::make(sys, c.spec(), "/job:ps/task:0", client_options({})));
  CHECK(value_of(s.ping("ps", 0)).job == "ps");
}

// Catches a CAF port where a stranger that connects and sends nothing (or
// stops inside its TLS handshake) holds a descriptor for ever, and a
// deadline that closes connections whose handshake went through: the
// client connected before the stranger is older than the deadline when the
// stranger is closed, and the line names the stranger alone.
TEST_CASE("a CAF peer that does not finish its handshake within handshake_timeout_ms is closed, "
          "with and without TLS, and a client's connection stays",
          "[security]") {
  bool secure = GENERATE(false, true);
  INFO((secure ? "with" : "without") << " [security]");
  test_cluster c{secure};
  c.add_node_lines("handshake_timeout_ms = 500\n");
  background_process node{c.node_args()};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));
  auto sec = secure ? client_security(c.config) : security_options{};
  system_config cfg{node_options{}, sec};
  caf::actor_system sys{cfg};
  auto s = value_of(session::make(sys, c.spec(), "/job:ps/task:0", client_options(sec)));
  REQUIRE(value_of(s.ping("ps", 0)).job == "ps");

  int fd = connect_loopback(c.port);
  REQUIRE(fd >= 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0);
  auto stranger = "127.0.0.1:" + std::to_string(ntohs(local.sin_port));
  auto start = std::chrono::steady_clock::now();
  bool closed = closed_within(fd, 10000ms);
  auto took = std::chrono::steady_clock::now() - start;
  ::close(fd);
  check_closed_at_deadline(node, closed, took, stranger);
  // The client's connection, older than the deadline, serves on.
  CHECK(value_of(s.ping("ps", 0)).job == "ps");
  CHECK(count(node.output(), "no handshake within") == 1);
}

// Catches a deadline that lets go of a connection once its TLS handshake is
// done: a stranger holding a certificate of the cluster CA (a member's
// stolen key, or a member's buggy program) that completes TLS and then never
// sends BASP's handshake held a descriptor and a session for ever. The
// deadline is the BASP handshake's, TLS included.
TEST_CASE("a peer that completes the TLS handshake with a cluster certificate but sends no BASP "
          "handshake is closed after handshake_timeout_ms, and the node serves on",
          "[security]") {
  test_cluster c{true};
  c.add_node_lines("handshake_timeout_ms = 500\n");
  background_process node{c.node_args()};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));
  auto sec = client_security(c.config);
  system_config cfg{node_options{}, sec};
  caf::actor_system sys{cfg};
  auto s = value_of(session::make(sys, c.spec(), "/job:ps/task:0", client_options(sec)));
  REQUIRE(value_of(s.ping("ps", 0)).job == "ps");

  // The stranger: the client's certificate, OpenSSL's blocking handshake.
  auto tls = value_of(make_tls_context(sec, "a stranger"));
  int fd = connect_loopback(c.port);
  REQUIRE(fd >= 0);
  auto start = std::chrono::steady_clock::now();
  timeval tv{5, 0}; // a blocking read below gives up after 5 s
  REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0);
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl{SSL_new(tls->native()), SSL_free};
  REQUIRE(ssl);
  REQUIRE(SSL_set_fd(ssl.get(), fd) == 1);
  REQUIRE(SSL_connect(ssl.get()) == 1);
  // The node took the certificate: what comes through TLS is its BASP
  // server handshake (a 32-byte header first).
  std::vector<char> buf(4096);
  size_t got = 0;
  while (got < 32) {
    size_t n = 0;
    if (SSL_read_ex(ssl.get(), buf.data(), buf.size(), &n) != 1)
      break;
    got += n;
  }
  REQUIRE(got >= 32);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0);
  auto stranger = "127.0.0.1:" + std::to_string(ntohs(local.sin_port));
  // A member is served while the stranger holds its connection.
  CHECK(value_of(s.ping("ps", 0)).job == "ps");

  // Silent from here on; the node closes it (a TLS alert, then the end).
  bool closed = false;
  auto deadline = start + 10s;
  while (!closed && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0)
      continue;
    size_t n = 0;
    closed = SSL_read_ex(ssl.get(), buf.data(), buf.size(), &n) != 1
             && SSL_get_error(ssl.get(), 0) != SSL_ERROR_WANT_READ;
  }
  auto took = std::chrono::steady_clock::now() - start;
  ssl.reset();
  ::close(fd);
  check_closed_at_deadline(node, closed, took, stranger);
  CHECK(node.output().find("refused " + stranger) == std::string::npos); // its TLS was fine
  // The member's connection, older than the deadline, serves on; a new one gets in.
  CHECK(value_of(s.ping("ps", 0)).job == "ps");
  caf::actor_system sys2{cfg};
  auto s2 = value_of(session::make(sys2, c.spec(), "/job:ps/task:0", client_options(sec)));
  CHECK(value_of(s2.ping("ps", 0)).job == "ps");
}

TEST_CASE("a CAF message over max_message_bytes closes its connection before the buffer is made",
          "[security]") {
  test_cluster c{false};
  c.add_node_lines("max_message_bytes = 1048576\n");
  background_process node{c.node_args()};
  REQUIRE(node.wait_for("actorflow-node ready", 30s));
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  auto opts = client_options({}, 3000ms);
  opts.data_plane = false; // the assign goes as a CAF message
  {
    auto s = value_of(session::make(sys, c.spec(), "/job:ps/task:0", opts));
    auto v = value_of(s.variable("big", {1 << 20}));
    auto start = std::chrono::steady_clock::now();
    auto assigned = s.run(s.assign(v, s.constant(tensor::filled(dtype::float32, {1 << 20}, 1.0))));
    CHECK_FALSE(assigned);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    INFO(node.output());
    CHECK(node.wait_for("announces a message of 41", 10s)); // 4 MiB and its message
    CHECK(node.output().find("max_message_bytes") != std::string::npos);
  }
  // The node serves on, to a client that keeps within the limit.
  system_config cfg2{node_options{}};
  caf::actor_system sys2{cfg2};
  auto s2 = value_of(session::make(sys2, c.spec(), "/job:ps/task:0", opts));
  CHECK(value_of(s2.ping("ps", 0)).job == "ps");
}

TEST_CASE("actorflow-node --restart-on-failure restarts a node killed with SIGKILL and stops on SIGTERM",
          "[security][node]") {
  test_cluster c{false};
  auto args = c.node_args();
  args.push_back("--restart-on-failure");
  background_process supervisor{args};
  REQUIRE(supervisor.wait_for("actorflow-node ready", 30s));
  auto first = ready_pids(supervisor.output()).at(0);
  REQUIRE(::kill(first, SIGKILL) == 0);
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (ready_pids(supervisor.output()).size() < 2 && std::chrono::steady_clock::now() < deadline)
    supervisor.read_output(100ms);
  INFO(supervisor.output());
  auto pids = ready_pids(supervisor.output());
  REQUIRE(pids.size() == 2);
  CHECK(pids[1] != first);
  CHECK(supervisor.output().find("was killed by signal 9") != std::string::npos);
  CHECK(supervisor.output().find("restart 1 of 10") != std::string::npos);
  {
    system_config cfg{node_options{}};
    caf::actor_system sys{cfg};
    auto s = value_of(session::make(sys, c.spec(), "/job:ps/task:0", client_options({})));
    CHECK(value_of(s.ping("ps", 0)).pid == pids[1]);
  }
  supervisor.signal(SIGTERM);
  CHECK(supervisor.wait_exit(15s) == 0);
  CHECK(::kill(pids[1], 0) == -1); // the child went with it
}

// Catches (issue 22): [security] ca = "/dev/zero" grew until std::bad_alloc
// aborted the node (exit 134); a FIFO blocked it for ever before it said
// anything. PEM files are read whole only if regular and at most a few MiB.
TEST_CASE("a PEM file that is a device, a FIFO or too large is refused, naming the key",
          "[security]") {
  temp_dir dir;
  REQUIRE(::mkfifo((dir / "ca.fifo").c_str(), 0600) == 0);
  write_file(dir / "big.pem", std::string(5 << 20, 'A'));
  write_file(dir / "x.pem", "not a certificate\n");
  for (const auto& [ca, says] :
       {std::pair<std::string, std::string>{"/dev/zero", "it is a character device, not a regular file"},
        {dir / "ca.fifo", "it is a FIFO (named pipe), not a regular file"},
        {dir / "big.pem", "it is 5242880 bytes, more than the limit of 4194304"}}) {
    CAPTURE(ca);
    security_options sec;
    sec.ca_file = ca;
    sec.cert_file = dir / "x.pem";
    sec.key_file = dir / "x.pem";
    auto ctx = make_tls_context(sec, "/job:ps/task:0");
    REQUIRE_FALSE(ctx);
    auto what = describe(ctx.error());
    CHECK(what.find("cannot read ca file '" + ca + "' ([security] ca): " + says)
          != std::string::npos);
  }
}

// Catches (issue 22): actorflow-certs read its config with its own JSON
// parse before the checked parsers: a config thousands deep crashed it
// (nlohmann recurses), and a FIFO as the config blocked it for ever.
TEST_CASE("actorflow-certs refuses a config nested too deep or that is a FIFO", "[security]") {
  temp_dir dir;
  write_file(dir / "deep.json", "{\"cluster\": {\"ps\": [\"127.0.0.1:2222\"]}, \"x\": "
                                  + std::string(200000, '[') + std::string(200000, ']') + "}");
  auto r = run_command({ACTORFLOW_CERTS_BINARY, "--config", dir / "deep.json"}, 20s);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("line 1: an array nests more than 64 levels") != std::string::npos);
  REQUIRE(::mkfifo((dir / "c.fifo").c_str(), 0600) == 0);
  r = run_command({ACTORFLOW_CERTS_BINARY, "--config", dir / "c.fifo"}, 20s);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("a FIFO (named pipe), not a regular file") != std::string::npos);
}
