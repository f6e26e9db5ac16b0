// The data plane over UCX between hosts of a trusted fabric (issue 12, part 1,
// "other hosts"; net/ucx_link.hpp): the same frames, ops and errors as on
// TCP, only when both ends trust the fabric, a peer's death seen as fast as a
// closed socket, hostile offers refused, nothing leaked. The peers here are
// on one host: ACTORFLOW_DATA_UCX=force makes them take UCX all the same.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <thread>

#include <spdlog/sinks/ringbuffer_sink.h>

#include "cells.hpp"
#include "certs.hpp"
#include "temp_dir.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "scoped_settings.hpp"
#include "wait.hpp"
#include "log_capture.hpp"
#include "net/data_plane.hpp"
#include "actors/variable_directory.hpp"
#include "core/log.hpp"
#include "actors/node.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "net/tls.hpp"
#include "config/loopback.hpp"
#include "net/ucx_link.hpp"
#include "net/testing_hooks.hpp"
#include "config/cluster_spec.hpp"
#include "core/fnv1a.hpp"
#include "core/wire_format.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

TEST_CASE("[security] trusted_fabric: false unless said, true or false only, named by file:line",
          "[ucx][config]") {
  // Bugs it catches: a fabric trusted by default (unencrypted UCX nobody
  // asked for), and a value such as "yes" taken silently (as true or false)
  // instead of an error that names where it is.
  auto none = parse_cluster_toml("[cluster]\nps = [\"a:1\"]\n", "c.toml");
  REQUIRE(none);
  CHECK_FALSE(none->security.trusted_fabric);
  auto on = parse_cluster_toml("[cluster]\nps = [\"a:1\"]\n[security]\ninsecure = true\n"
                               "trusted_fabric = true\n",
                               "c.toml");
  REQUIRE(on);
  CHECK(on->security.trusted_fabric);
  CHECK_FALSE(on->security.enabled()); // it is no TLS setting
  auto bad = parse_cluster_toml("[cluster]\nps = [\"a:1\"]\n[security]\ntrusted_fabric = \"yes\"\n",
                                "c.toml");
  REQUIRE_FALSE(bad);
  CHECK(describe(bad.error()).find("c.toml:4: security.trusted_fabric must be true or false")
        != std::string::npos);
  auto json = parse_cluster_json(R"({"cluster": {"ps": ["a:1"]}, "security": {"trusted_fabric": true}})",
                                 "tf.json");
  REQUIRE(json);
  CHECK(json->security.trusted_fabric);
}

#ifdef ACTORFLOW_WITH_UCX

namespace {

/// A hook for the client's UCX connect of an offer (net/testing_hooks.hpp)
/// for its lifetime; then none, and no UCX failure remembered.
struct scoped_connect_hook {
  explicit scoped_connect_hook(
    std::function<caf::error(ucx_channel&, const std::string&)> f) {
    wire_test_hooks()->ucx_client_connect = std::move(f);
  }
  ~scoped_connect_hook() {
    wire_test_hooks()->ucx_client_connect = nullptr;
    auto& [mutex, map] = ucx_failures();
    std::lock_guard<std::mutex> guard{mutex};
    map.clear();
  }
};

/// A node's data plane in this process with a scalar `v` (1) and a float32
/// `big` of `big_floats` elements (0).
struct local_node {
  std::shared_ptr<variable_directory> dir = std::make_shared<variable_directory>();
  std::unique_ptr<data_plane_server> srv;
  local_node(int64_t big_floats, bool trusts) {
    auto v = float_cell("v", {}, 1);
    auto big = float_cell("big", {big_floats}, 0);
    REQUIRE((v && big));
    dir->put("v", {variable_cell_actor{}, v});
    dir->put("big", {variable_cell_actor{}, big});
    data_plane_limits limits;
    limits.trusted_fabric = trusts;
    srv = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "test node", limits));
  }
};

/// A channel to the node; on this host it would take shared memory rather
/// than stay on TCP unless `shm` is false.
std::unique_ptr<data_channel> open_channel(uint16_t port, bool trusts, bool shm = false) {
  return value_of(data_channel::connect("127.0.0.1", port, "test node", 10s, {}, nullptr, nullptr,
                                        shm, trusts));
}

using af::test::log_capture;

int raw_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

/// Reads one reply frame (header and payload) from `fd`; false if the
/// connection closed first (or nothing came within the socket's 5 s).
bool read_reply(int fd, wire::header& r, std::string& payload) {
  if (recv(fd, &r, sizeof(r), MSG_WAITALL) != static_cast<ssize_t>(sizeof(r)))
    return false;
  payload.assign(std::min<uint64_t>(r.payload_bytes, 1 << 20), '\0');
  return payload.empty()
         || recv(fd, payload.data(), payload.size(), MSG_WAITALL)
              == static_cast<ssize_t>(payload.size());
}

size_t count_entries(const char* dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir)) {
    while (auto* e = readdir(d))
      if (e->d_name[0] != '.')
        ++n;
    closedir(d);
  }
  return n;
}

} // namespace

TEST_CASE("variable ops, a 64 MiB tensor and error replies work alike over UCX and TCP", "[ucx]") {
  // Bugs it catches: a frame cut, doubled or reordered where UCX's received
  // pieces end (a header split across two pieces, a 64 MiB + 12 byte payload
  // over many), a value or version that differs from TCP's, an error reply
  // whose skipped payload leaves the stream out of step (the op after it must
  // work), and a channel that says UCX but is not on it.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  bool ucx = GENERATE(true, false);
  INFO((ucx ? "ucx" : "tcp"));
  const int64_t floats = (int64_t{16} << 20) + 3;
  local_node node{floats, true};
  auto ch = open_channel(node.srv->port(), ucx);
  // The first op goes on TCP: the offer comes after the node's first answer.
  auto first = value_of(ch->call(var_op::read, "v", nullptr, false));
  CHECK(first.first.at(0) == 1);
  CHECK(ch->transport() == "tcp");
  auto one = tensor::scalar(2);
  auto added = value_of(ch->call(var_op::assign_add, "v", &one, true));
  CHECK(added.first.at(0) == 3);
  INFO("transport: " << ch->transport());
  CHECK(ch->transport().rfind(ucx ? "ucx" : "tcp", 0) == 0);
  auto subbed = value_of(ch->call(var_op::assign_sub, "v", &one, true));
  CHECK(subbed.first.at(0) == 1);
  CHECK(subbed.second == added.second + 1);

  tensor big{dtype::float32, {floats}};
  for (int64_t i = 0; i < floats; ++i)
    big.mutable_data<float>()[i] = static_cast<float>(i % 1000003) * 0.5f;
  REQUIRE(ch->call(var_op::assign, "big", &big, false));
  auto back = value_of(ch->call(var_op::read, "big", nullptr, false));
  REQUIRE(back.first.nbytes() == big.nbytes());
  CHECK(std::memcmp(back.first.bytes(), big.bytes(), big.nbytes()) == 0);
  auto doubled = value_of(ch->call(var_op::assign_add, "big", &big, true));
  CHECK(doubled.first.at(floats - 1) == 2 * big.at(floats - 1));
  CHECK(doubled.first.at(1234567) == 2 * big.at(1234567));

  auto missing = ch->call(var_op::read, "nope", nullptr, false);
  REQUIRE_FALSE(missing);
  CHECK(is(missing.error(), af_error::not_found));
  CHECK(describe(missing.error()).find("no variable 'nope'") != std::string::npos);
  auto wrong = tensor::filled(dtype::float32, {int64_t{1} << 20}, 1);
  auto refused = ch->call(var_op::assign, "big", &wrong, false);
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), af_error::shape_mismatch));
  CHECK_FALSE(ch->broken());
  auto after = value_of(ch->call(var_op::read, "v", nullptr, false));
  CHECK(after.first.at(0) == 1);
  CHECK(ch->transport().rfind(ucx ? "ucx" : "tcp", 0) == 0);
}

TEST_CASE("without trusted_fabric no offer of UCX is made, and ACTORFLOW_DATA_UCX=off makes none",
          "[ucx]") {
  // Bugs it catches: a client that offers UCX (unencrypted) to a node of
  // another host although its config does not trust the fabric, and an
  // "off" that is not honoured. The node here trusts the fabric and takes
  // any offer, so an offer made would show as a UCX transport.
  scoped_trust untrusted{false};
  local_node node{4, true};
  SECTION("the client does not trust the fabric") {
    scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
    auto ch = open_channel(node.srv->port(), false);
    for (int i = 0; i < 3; ++i)
      REQUIRE(ch->call(var_op::read, "v", nullptr, false));
    CHECK(ch->transport() == "tcp");
  }
  SECTION("ACTORFLOW_DATA_UCX=off") {
    scoped_env off{"ACTORFLOW_DATA_UCX", "off"};
    auto ch = open_channel(node.srv->port(), true);
    for (int i = 0; i < 3; ++i)
      REQUIRE(ch->call(var_op::read, "v", nullptr, false));
    CHECK(ch->transport() == "tcp");
  }
  SECTION("a peer on this host gets shared memory, not UCX, unless forced") {
    scoped_env plain{"ACTORFLOW_DATA_UCX", nullptr};
    scoped_env shm{"ACTORFLOW_DATA_SHM", nullptr};
    auto ch = open_channel(node.srv->port(), true, true);
    for (int i = 0; i < 3; ++i)
      REQUIRE(ch->call(var_op::read, "v", nullptr, false));
    CHECK(ch->transport() == "shared memory");
  }
}

TEST_CASE("a node that does not trust the fabric declines UCX and the ops go on over TCP",
          "[ucx]") {
  // Bugs it catches: a node that takes unencrypted UCX its config does not
  // allow, and a declined offer that leaves the client and node out of step
  // (the op after the offer must work, on TCP).
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  local_node node{1 << 20, false};
  auto ch = open_channel(node.srv->port(), true);
  REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  auto two = tensor::scalar(2);
  auto r = value_of(ch->call(var_op::assign_add, "v", &two, true));
  CHECK(r.first.at(0) == 3);
  auto big = tensor::filled(dtype::float32, {1 << 20}, 7);
  REQUIRE(ch->call(var_op::assign, "big", &big, false));
  auto back = value_of(ch->call(var_op::read, "big", nullptr, false));
  CHECK(back.first.at((1 << 20) - 1) == 7);
  CHECK(ch->transport() == "tcp");
}

TEST_CASE("hostile offers of UCX are refused with a clear log and the node keeps serving",
          "[ucx][faults]") {
  // Bugs it catches: a node that allocates or reads the length an offer
  // declares (a terabyte address), one that hands garbage to UCX's address
  // parser (a crash, or an endpoint to nowhere that the client would wait
  // on), and a refusal that takes the node's data plane down with it.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  local_node node{4, true};
  log_capture logs;
  {
    int fd = raw_connect(node.srv->port());
    REQUIRE(fd >= 0);
    wire::header h;
    h.kind = static_cast<uint8_t>(wire::kind::ucx_offer);
    h.payload_bytes = uint64_t{1} << 40;
    REQUIRE(send(fd, &h, sizeof(h), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h)));
    wire::header r;
    std::string text;
    REQUIRE(read_reply(fd, r, text));
    CHECK(r.status == static_cast<uint8_t>(af_error::invalid_argument));
    CHECK(text.find("an offer of UCX with a worker address of 1099511627776 bytes")
          != std::string::npos);
    close(fd);
    CHECK(eventually([&] { return logs.has("refused", "an offer of UCX with a worker address"); },
                     5s));
  }
  {
    int fd = raw_connect(node.srv->port());
    REQUIRE(fd >= 0);
    std::string garbage(300, '\x5a');
    wire::header h;
    h.kind = static_cast<uint8_t>(wire::kind::ucx_offer);
    h.payload_bytes = garbage.size();
    REQUIRE(send(fd, &h, sizeof(h), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h)));
    REQUIRE(send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL)
            == static_cast<ssize_t>(garbage.size()));
    wire::header r;
    std::string payload;
    REQUIRE(read_reply(fd, r, payload));
    CHECK(r.status == 0);
    CHECK(r.version == 0); // declined: the connection stays on TCP
    CHECK(r.payload_bytes == 0);
    CHECK(eventually([&] { return logs.has("refused its offer of UCX", "not a UCX worker address"); },
                     5s));
    // The same connection goes on over TCP.
    wire::header q;
    q.kind = static_cast<uint8_t>(wire::kind::read);
    q.name_len = 1;
    REQUIRE(send(fd, &q, sizeof(q), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(q)));
    REQUIRE(send(fd, "v", 1, MSG_NOSIGNAL) == 1);
    REQUIRE(read_reply(fd, r, payload));
    CHECK(r.status == 0);
    CHECK(r.has_tensor == 1);
    close(fd);
  }
  // And the node serves others, over UCX.
  auto ch = open_channel(node.srv->port(), true);
  REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  CHECK(ch->transport().rfind("ucx", 0) == 0);
}

TEST_CASE("an offer of UCX in a valid envelope whose address is of another format is refused "
          "before UCX parses it, a second refused offer closes the connection",
          "[ucx][faults]") {
  // Bugs it catches: a node that hands an address of another format to
  // ucp_ep_create, whose parser asserts and aborts the process (the attacker's
  // 84-byte offer, header byte 0x0c, killed any trusting node), and a client
  // that keeps a node making and refusing workers (~14 ms of CPU each).
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  local_node node{4, true};
  log_capture logs;
  std::string addr(64, '\0');
  addr[0] = '\x0c';
  std::string offer = "AFUCXAD1";
  auto n = static_cast<uint32_t>(addr.size());
  auto sum = fnv1a64(addr.data(), addr.size());
  offer.append(reinterpret_cast<const char*>(&n), 4);
  offer.append(reinterpret_cast<const char*>(&sum), 8);
  offer += addr;
  int fd = raw_connect(node.srv->port());
  REQUIRE(fd >= 0);
  auto send_offer = [&] {
    wire::header h;
    h.kind = static_cast<uint8_t>(wire::kind::ucx_offer);
    h.payload_bytes = offer.size();
    REQUIRE(send(fd, &h, sizeof(h), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h)));
    REQUIRE(send(fd, offer.data(), offer.size(), MSG_NOSIGNAL)
            == static_cast<ssize_t>(offer.size()));
  };
  send_offer();
  wire::header r;
  std::string payload;
  REQUIRE(read_reply(fd, r, payload));
  CHECK(r.status == 0);
  CHECK(r.version == 0); // declined
  CHECK(eventually([&] { return logs.has("refused its offer of UCX", "of format 12"); }, 5s));
  send_offer(); // again: the connection is closed, unanswered
  pollfd p{fd, POLLIN, 0};
  REQUIRE(poll(&p, 1, 5000) == 1); // within 5 s: closed, or an answer (wrong)
  char byte;
  CHECK(recv(fd, &byte, 1, 0) <= 0);
  close(fd);
  // The node lives and serves others over UCX.
  auto ch = open_channel(node.srv->port(), true);
  REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  CHECK(ch->transport().rfind("ucx", 0) == 0);
}

TEST_CASE("with TLS and a trusted fabric, the handshake authenticates both ends and the frames "
          "then move to UCX",
          "[ucx][security]") {
  // Bugs it catches: an offer or answer sent beside the record layer (the
  // node would read it as a bad record, or a stranger could inject one), a
  // TLS byte left on the socket after the move read as a peer's stray byte
  // (the connection failing on its first op over UCX), and a channel that
  // still says "tls" while its frames go by UCX, or the other way round.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  temp_dir dir;
  auto config = dir / "cluster.toml";
  std::string cluster = "[cluster]\nps = [\"127.0.0.1:" + std::to_string(free_loopback_port()) + "\"]\n";
  write_file(config, cluster);
  write_file(config, cluster + "\n" + make_certs(config) + "trusted_fabric = true\n");
  auto cfg = value_of(load_cluster_config(config));
  CHECK(cfg.security.trusted_fabric);
  auto node_tls = value_of(make_tls_context(value_of(security_for(cfg.security, "ps-0")),
                                            "/job:ps/task:0"));
  auto client_tls = value_of(make_tls_context(value_of(security_for(cfg.security, "client")),
                                              "client"));
  auto dir_ = std::make_shared<variable_directory>();
  auto big = float_cell("big", {int64_t{4} << 20}, 0);
  REQUIRE(big);
  dir_->put("big", {variable_cell_actor{}, big});
  data_plane_limits limits;
  limits.trusted_fabric = cfg.security.trusted_fabric;
  auto srv = value_of(data_plane_server::start(dir_, "127.0.0.1", 0, "/job:ps/task:0", limits,
                                               node_tls));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "/job:ps/task:0", 10s, {},
                                           client_tls, nullptr, true, cfg.security.trusted_fabric));
  REQUIRE(ch->call(var_op::read, "big", nullptr, false));
  CHECK(ch->transport() == "tls");
  auto value = tensor::filled(dtype::float32, {int64_t{4} << 20}, 3);
  REQUIRE(ch->call(var_op::assign, "big", &value, false));
  INFO("transport: " << ch->transport());
  CHECK(ch->transport().rfind("ucx", 0) == 0);
  auto back = value_of(ch->call(var_op::read, "big", nullptr, false));
  CHECK(back.first.at((int64_t{4} << 20) - 1) == 3);
  CHECK(ch->transport().rfind("ucx", 0) == 0);
  // A client without a certificate of the cluster CA is still refused
  // before anything: no offer of UCX can come from it.
  auto stranger = data_channel::connect("127.0.0.1", srv->port(), "/job:ps/task:0", 5s, {}, nullptr,
                                        nullptr, true, true);
  if (stranger) {
    auto r = (*stranger)->call(var_op::read, "big", nullptr, false);
    CHECK_FALSE(r);
  }
}

TEST_CASE("no descriptors or threads are left after many UCX connections", "[ucx]") {
  // Bugs it catches: a worker, endpoint, event fd or connection thread not
  // released when a UCX connection closes (on either end), which a client
  // that reconnects for a long time would pile up until the node runs out.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  local_node node{1024, true};
  auto cycle = [&] {
    auto ch = open_channel(node.srv->port(), true);
    REQUIRE(ch->call(var_op::read, "v", nullptr, false));
    auto r = ch->call(var_op::read, "big", nullptr, false);
    REQUIRE(r);
    REQUIRE(ch->transport().rfind("ucx", 0) == 0);
  };
  // The first cycles make what lives as long as the process (UCX's context,
  // its async thread).
  for (int i = 0; i < 3; ++i)
    cycle();
  size_t fds = 0, threads = 0;
  REQUIRE(eventually(
    [&] {
      fds = count_entries("/proc/self/fd");
      threads = count_entries("/proc/self/task");
      cycle();
      return count_entries("/proc/self/fd") <= fds && count_entries("/proc/self/task") <= threads;
    },
    10s));
  fds = count_entries("/proc/self/fd");
  threads = count_entries("/proc/self/task");
  for (int i = 0; i < 60; ++i)
    cycle();
  // The node's connection threads end once they see the close.
  bool settled = eventually([&] {
    return count_entries("/proc/self/fd") <= fds && count_entries("/proc/self/task") <= threads;
  }, 10s);
  INFO("fds " << fds << " -> " << count_entries("/proc/self/fd") << ", threads " << threads << " -> "
              << count_entries("/proc/self/task"));
  CHECK(settled);
}

TEST_CASE("over UCX a stopped node costs a call its own wait or a cancel, and a SIGKILLed one "
          "fails it at once",
          "[ucx][faults]") {
  // Bugs it catches: a wait on UCX that a call's wait or cancel flag does
  // not bound (the channel's 30 s instead, or forever), and a client that
  // waits on UCX for a send to finish (or a reply) until its timeout because
  // it does not watch the TCP socket, or because UCX does not report the
  // peer's end.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_hook_trust trust{true}; // the node processes get it through their config
  scoped_trust trusted{true};
  node_options opts;
  auto pc = value_of(process_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 30s;
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0", so));
  const int64_t n = 16 << 20;
  {
    auto d = value_of(s.device("/job:ps/task:0"));
    value_of(s.variable("big", {n}, initializer::zeros()));
    value_of(s.variable("v", {}, initializer::ones()));
    require_ok(s.initialize());
  }
  std::smatch m;
  auto out = pc->output("ps", 0);
  static const std::regex port_re{R"(data plane port (\d+))"};
  REQUIRE(std::regex_search(out, m, port_re));
  auto port = static_cast<uint16_t>(std::stoul(m[1].str()));
  auto open_on_ucx = [&] {
    auto ch = value_of(data_channel::connect("127.0.0.1", port, "/job:ps/task:0", 30s, {}, nullptr,
                                             nullptr, true, true));
    REQUIRE(ch->call(var_op::read, "v", nullptr, false));
    REQUIRE(ch->call(var_op::read, "v", nullptr, false));
    INFO("transport: " << ch->transport());
    REQUIRE(ch->transport().rfind("ucx", 0) == 0);
    return ch;
  };
  auto value = tensor::filled(dtype::float32, {n}, 2);
  using clock = std::chrono::steady_clock;
  {
    // A call's own wait: 1 s, not the channel's 30 s.
    auto ch = open_on_ucx();
    REQUIRE(pc->signal("ps", 0, SIGSTOP));
    auto t0 = clock::now();
    auto r = ch->call(var_op::assign, "big", &value, false, 0, 1000ms);
    auto took = clock::now() - t0;
    REQUIRE(pc->signal("ps", 0, SIGCONT));
    REQUIRE_FALSE(r);
    INFO(describe(r.error()));
    CHECK(is(r.error(), af_error::timeout));
    CHECK(took >= 900ms);
    CHECK(took < 5s);
  }
  {
    // A cancel: within a fraction of a second of the flag.
    auto ch = open_on_ucx();
    auto cancel = std::make_shared<std::atomic<bool>>(false);
    ch->set_cancel(cancel);
    REQUIRE(pc->signal("ps", 0, SIGSTOP));
    caf::expected<std::pair<tensor, uint64_t>> r{caf::error{}};
    std::atomic<bool> finished{false};
    std::thread caller{[&] {
      r = ch->call(var_op::assign, "big", &value, false);
      finished = true;
    }};
    // The flag is set once the call is under way (it cannot finish: the node is stopped).
    CHECK_FALSE(eventually([&] { return finished.load(); }, 300ms));
    auto t0 = clock::now();
    *cancel = true;
    caller.join();
    auto took = clock::now() - t0;
    REQUIRE(pc->signal("ps", 0, SIGCONT));
    REQUIRE_FALSE(r);
    INFO(describe(r.error()));
    CHECK(is(r.error(), af_error::cancelled));
    CHECK(took < 2s);
  }
  auto ch = open_on_ucx();
  REQUIRE(pc->signal("ps", 0, SIGSTOP));
  blocking_call<caf::expected<std::pair<tensor, uint64_t>>> call{
    [&] { return ch->call(var_op::assign, "big", &value, false); }};
  // Asleep in its wait (for the send or the reply), not done.
  bool waiting = call.asleep(10s);
  auto killed = std::chrono::steady_clock::now();
  pc->signal("ps", 0, SIGKILL);
  auto& result = call.join();
  auto ended = call.ended();
  REQUIRE(waiting);
  REQUIRE_FALSE(result);
  INFO(describe(result.error()));
  CHECK(is(result.error(), af_error::peer_down));
  CHECK(describe(result.error()).find("/job:ps/task:0") != std::string::npos);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(ended - killed);
  INFO("the call failed " << took.count() << " ms after the kill");
  CHECK(took < 2s); // the call's own timeout is 30 s
}

TEST_CASE("over UCX a reply longer than the node's frame timeout goes through while it moves",
          "[.][ucx][ucx-long-reply]") { // run alone: tests/CMakeLists.txt
  // Bug it catches: the node's send over UCX bounded by the frame timeout
  // from the start of the whole reply instead of from the last progress, so
  // a 256 MiB read failed ("it took nothing of its reply for 300 ms") once
  // it took longer than 300 ms although its bytes kept moving (TCP works).
  // The reader is made slow on purpose (100 ms after each 8 MiB it takes),
  // so that every reply takes longer than the 2 s bound on any machine,
  // while no pause of the reader's comes near it, even on a loaded one (with
  // a 1 s bound and 16 MiB steps, two CPU hogs beside it made a 4 MiB piece
  // of the send wait 1 s once in eight runs).
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  constexpr uint64_t pace_bytes = uint64_t{8} << 20;
  std::atomic<uint64_t> taken{0};
  wire_test_hooks()->ucx_bytes_taken = [&taken](uint64_t bytes) {
    auto before = taken.fetch_add(bytes);
    if ((before + bytes) / pace_bytes != before / pace_bytes)
      std::this_thread::sleep_for(100ms); // pacing the reader, not waiting for anything
  };
  struct unhook {
    ~unhook() { wire_test_hooks()->ucx_bytes_taken = nullptr; }
  } unhook_at_end;
  const int64_t floats = int64_t{64} << 20; // 256 MiB: 32 pauses, 3.2 s at least
  auto dir = std::make_shared<variable_directory>();
  auto v = float_cell("v", {}, 1);
  auto big = float_cell("big", {floats}, 0.5f);
  REQUIRE((v && big));
  dir->put("v", {variable_cell_actor{}, v});
  dir->put("big", {variable_cell_actor{}, big});
  data_plane_limits limits;
  limits.trusted_fabric = true;
  limits.frame = 2000ms;
  auto srv = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "test node", limits));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 60s, {}, nullptr,
                                           nullptr, false, true));
  for (int i = 0; i < 2; ++i)
    REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  REQUIRE(ch->transport().rfind("ucx", 0) == 0);
  for (int i = 0; i < 2; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = ch->call(var_op::read, "big", nullptr, false);
    auto took = std::chrono::steady_clock::now() - t0;
    INFO("read " << i << " took "
                 << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms"
                 << (r ? std::string{} : ": " + to_string(r.error())));
    REQUIRE(r);
    CHECK(took > limits.frame); // longer than the bound: the case this test is for
    CHECK(r->first.nbytes() == static_cast<size_t>(floats) * 4);
    CHECK(r->first.at(floats - 1) == 0.5f);
  }
  CHECK(ch->transport().rfind("ucx", 0) == 0);
  srv->stop();
}

TEST_CASE("a node whose limits do not trust the fabric declines UCX even when the process's flag "
          "is set",
          "[ucx]") {
  // Bug it catches: a data plane that takes unencrypted UCX because another
  // part of the process (a node, a session, the REPL) trusts the fabric,
  // although this node's own config does not.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust trusting{true};
  local_node node{4, false};
  log_capture logs;
  auto ch = open_channel(node.srv->port(), true);
  for (int i = 0; i < 3; ++i)
    REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  CHECK(ch->transport() == "tcp");
  CHECK(eventually([&] { return logs.has("offered UCX", "this node does not trust the fabric"); },
                   5s));
}

TEST_CASE("a UCX connect that fails after the node took the offer carries the op on TCP, once "
          "and for good",
          "[ucx][faults]") {
  // Bugs it catches: a failed UCX connect on the client's side that drops
  // the channel and fails the op (the node cannot go back to TCP), and a
  // reconnect that offers UCX again, so that every op after each reconnect
  // fails the same way.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  auto dir = std::make_shared<variable_directory>();
  auto v = float_cell("v", {}, 1);
  REQUIRE(v);
  dir->put("v", {variable_cell_actor{}, v});
  data_plane_limits limits;
  limits.trusted_fabric = true;
  limits.idle = 300ms; // the node closes the quiet connection: the channel reconnects
  auto srv = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "test node", limits));
  log_capture logs;
  int failures = 1; // the next connect fails as if the node's worker were unreachable
  scoped_connect_hook hook{[&](ucx_channel& mine, const std::string& node_address) {
    if (failures > 0) {
      --failures;
      return make_error(af_error::unreachable, "a test hook failed this connect");
    }
    return mine.connect(node_address);
  }};
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 10s, {}, nullptr,
                                           nullptr, false, true));
  REQUIRE(ch->call(var_op::read, "v", nullptr, false)); // TCP; the offer is due
  auto one = tensor::scalar(1);
  auto r = ch->call(var_op::assign_add, "v", &one, true); // offered, failed, carried on TCP
  REQUIRE(r);
  CHECK(r->first.at(0) == 2);
  CHECK(ch->transport() == "tcp");
  CHECK(failures == 0); // the offer was made
  CHECK(logs.has("goes on TCP", "UCX_NET_DEVICES"));
  // The node drops the quiet connection; the next ops go on a fresh one,
  // which offers UCX no more (the hook is spent: an offer would now work).
  REQUIRE(eventually([&] { return logs.has("closed the connection of", "idle for"); }, 10s));
  for (int i = 0; i < 3; ++i)
    REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  CHECK(ch->transport() == "tcp");
  srv->stop();
}

TEST_CASE("a first op over UCX that gets no answer fails, and fresh channels to that node stay on "
          "TCP",
          "[ucx][faults]") {
  // Bug it catches: a UCX path that does not work (the node's worker
  // unreachable from here, an endpoint that never answers) offered again by
  // every fresh channel to that node, so that each op after each reconnect
  // waits out its deadline the same way.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  local_node node{4, true};
  log_capture logs;
  auto decoy = value_of(ucx_channel::create()); // a worker nobody drives
  // The next connect goes to the decoy instead of the node's worker; once.
  std::string decoy_address = decoy->address();
  scoped_connect_hook hook{[&](ucx_channel& mine, const std::string& node_address) {
    auto to = std::exchange(decoy_address, std::string{});
    return mine.connect(to.empty() ? node_address : to);
  }};
  auto ch = open_channel(node.srv->port(), true);
  REQUIRE(ch->call(var_op::read, "v", nullptr, false)); // TCP; the offer is due
  auto r = ch->call(var_op::read, "v", nullptr, false, 0, 500ms);
  REQUIRE_FALSE(r);
  INFO(describe(r.error()));
  CHECK(is(r.error(), af_error::timeout));
  CHECK(logs.has("the first op over UCX to test node failed", "UCX_NET_DEVICES"));
  // The decoy is spent: an offer now would work, but none is made.
  auto again = open_channel(node.srv->port(), true);
  for (int i = 0; i < 3; ++i)
    REQUIRE(again->call(var_op::read, "v", nullptr, false));
  CHECK(again->transport() == "tcp");
}

TEST_CASE("an offer of shared memory on a connection already on UCX is declined", "[ucx][faults]") {
  // Bug it catches: a node that maps (and counts against max_shm_bytes) a
  // segment offered by a client already on UCX, which never uses it.
  scoped_env force{"ACTORFLOW_DATA_UCX", "force"};
  scoped_trust untrusted{false};
  local_node node{4, true};
  int fd = raw_connect(node.srv->port());
  REQUIRE(fd >= 0);
  auto mine = value_of(ucx_channel::create());
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::ucx_offer);
  h.payload_bytes = mine->address().size();
  REQUIRE(send(fd, &h, sizeof(h), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h)));
  REQUIRE(send(fd, mine->address().data(), mine->address().size(), MSG_NOSIGNAL)
          == static_cast<ssize_t>(mine->address().size()));
  wire::header r;
  std::string theirs;
  REQUIRE(read_reply(fd, r, theirs));
  REQUIRE(r.version == 1); // taken
  REQUIRE_FALSE(mine->connect(theirs));
  ucx_channel::bound b;
  b.deadline = std::chrono::steady_clock::now() + 10s;
  auto seg = value_of(shm_channel::create());
  wire::header o;
  o.kind = static_cast<uint8_t>(wire::kind::shm_offer);
  o.name_len = static_cast<uint32_t>(seg->name().size());
  o.version = seg->segment_bytes();
  iovec offer[2] = {{&o, sizeof(o)}, {const_cast<char*>(seg->name().data()), seg->name().size()}};
  REQUIRE(mine->write(offer, 2, fd, b) == ucx_channel::status::done);
  wire::header a;
  REQUIRE(mine->read(&a, sizeof(a), fd, b) == ucx_channel::status::done);
  CHECK(a.kind == static_cast<uint8_t>(wire::kind::reply));
  CHECK(a.status == 0);
  CHECK(a.version == 0); // declined
  // The connection goes on over UCX.
  wire::header q;
  q.kind = static_cast<uint8_t>(wire::kind::read);
  q.name_len = 1;
  iovec req[2] = {{&q, sizeof(q)}, {const_cast<char*>("v"), 1}};
  REQUIRE(mine->write(req, 2, fd, b) == ucx_channel::status::done);
  wire::header ans;
  REQUIRE(mine->read(&ans, sizeof(ans), fd, b) == ucx_channel::status::done);
  CHECK(ans.status == 0);
  CHECK(ans.has_tensor == 1);
  float value = 0;
  REQUIRE(ans.payload_bytes == sizeof(value));
  REQUIRE(mine->read(&value, sizeof(value), fd, b) == ucx_channel::status::done);
  CHECK(value == 1);
  seg->unlink();
  mine.reset();
  close(fd);
}

TEST_CASE("a look at a UCX stream says whether a byte is in without taking it, and sees the "
          "peer's socket end while its endpoint lives",
          "[ucx][faults]") {
  // Bugs it catches: a look (ucx_channel::await_bytes: which of a sparse
  // step's answers came first) that says "in" with nothing there or takes
  // what it saw, and one that does not wait that never looks at the socket:
  // a peer that died with nothing of ours in flight may not fail the
  // endpoint for a long time (RDMA), so the chief did not see that ps's end
  // and sat in another ps's round (docs/sparse.md "A ps that dies").
  auto a = value_of(ucx_channel::create());
  auto b = value_of(ucx_channel::create());
  REQUIRE_FALSE(a->connect(b->address()));
  REQUIRE_FALSE(b->connect(a->address()));
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto until = [](std::chrono::steady_clock::time_point t) {
    ucx_channel::bound bd;
    bd.deadline = t;
    bd.spin = std::chrono::microseconds{0};
    return bd;
  };
  CHECK(a->await_bytes(fds[0], until(now())) == ucx_channel::status::timeout);
  CHECK(a->await_bytes(fds[0], until(now() + 100ms)) == ucx_channel::status::timeout);
  uint64_t sent = 0x5eed;
  iovec iov{&sent, sizeof(sent)};
  ucx_channel::status wrote = ucx_channel::status::closed;
  std::thread writer{[&] { wrote = b->write(&iov, 1, fds[1], until(now() + 10s)); }};
  CHECK(a->await_bytes(fds[0], until(now() + 10s)) == ucx_channel::status::done);
  writer.join();
  REQUIRE(wrote == ucx_channel::status::done);
  // Looked at, not taken: a second look says the same, and the read has it.
  CHECK(a->await_bytes(fds[0], until(now())) == ucx_channel::status::done);
  uint64_t got = 0;
  REQUIRE(a->read(&got, sizeof(got), fds[0], until(now() + 10s)) == ucx_channel::status::done);
  CHECK(got == sent);
  CHECK(a->await_bytes(fds[0], until(now())) == ucx_channel::status::timeout);
  // The peer's socket ends; its endpoint stays: a look that does not wait says so.
  close(fds[1]);
  CHECK(a->await_bytes(fds[0], until(now())) == ucx_channel::status::closed);
  close(fds[0]);
}

#else

TEST_CASE("built without UCX, a trusting client stays on TCP", "[ucx]") {
  // Bug it catches: a build without libucx-dev that offers UCX anyway (a
  // frame the node cannot take) or fails the connection.
  CHECK_FALSE(ucx_channel::available());
  auto dir = std::make_shared<variable_directory>();
  auto v = float_cell("v", {}, 1);
  REQUIRE(v);
  dir->put("v", {variable_cell_actor{}, v});
  data_plane_limits limits;
  limits.trusted_fabric = true;
  auto srv = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "test node", limits));
  setenv("ACTORFLOW_DATA_SHM", "off", 1);
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 10s, {}, nullptr,
                                           nullptr, true, true));
  unsetenv("ACTORFLOW_DATA_SHM");
  for (int i = 0; i < 3; ++i)
    REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  CHECK(ch->transport() == "tcp");
}

#endif

TEST_CASE("a process whose actor system's [security] says trusted_fabric without certificates "
          "trusts the fabric for its channels",
          "[ucx]") {
  // Bug it catches: the system's [security] read for trust only when it also
  // had certificates, so a plaintext REPL or client with trusted_fabric = true
  // never offered UCX (attacker finding F3).
  bool was = process_trusted_fabric().load();
  process_trusted_fabric() = false;
  security_options sec;
  sec.trusted_fabric = true;
  system_config cfg{node_options{}, sec};
  caf::actor_system sys{cfg};
  auto tls = check_security(sys, security_options{}, "test client");
  REQUIRE(tls);
  CHECK(*tls == nullptr); // still plaintext
  CHECK(process_trusted_fabric().load());
  process_trusted_fabric() = was;
}

// Bug it catches: a test switch in the release library (issue 23, item 5):
// ACTORFLOW_TRUSTED_FABRIC=1 in a node's environment turned on unencrypted
// UCX on a TLS cluster. Now only [security] trusted_fabric, or a test
// binary's hook (net/testing_hooks.hpp, which a program does not have),
// trusts the fabric; the variable is this test binary's to read.
TEST_CASE("ACTORFLOW_TRUSTED_FABRIC in a node's environment trusts no fabric: the library reads "
          "no test switch",
          "[ucx][security]") {
  auto* hooks = wire_test_hooks();
  REQUIRE(hooks != nullptr); // this binary has them (tests/wire_test_hooks.cpp)
  struct restore {
    bool hook = wire_test_hooks()->trusted_fabric;
    bool process = process_trusted_fabric().load();
    const char* env = std::getenv("ACTORFLOW_TRUSTED_FABRIC");
    std::string was = env != nullptr ? env : "";
    ~restore() {
      wire_test_hooks()->trusted_fabric = hook;
      process_trusted_fabric() = process;
      if (env != nullptr)
        setenv("ACTORFLOW_TRUSTED_FABRIC", was.c_str(), 1);
      else
        unsetenv("ACTORFLOW_TRUSTED_FABRIC");
    }
  } restore;
  hooks->trusted_fabric = false;
  process_trusted_fabric() = false;
  setenv("ACTORFLOW_TRUSTED_FABRIC", "1", 1);
  // Whether a node started now (plaintext, loopback) trusts the fabric: it
  // then sets the process's flag for its own channels (node.cpp).
  auto node_trusts = [] {
    node_options opts;
    system_config cfg{opts};
    caf::actor_system sys{cfg};
    auto node = start_node(sys, "ps", 0, "127.0.0.1", 0, opts);
    REQUIRE(node);
    bool trusted = process_trusted_fabric().load();
    node->data_plane->stop();
    unregister_local_node(node->address);
    caf::anon_send_exit(node->actor, caf::exit_reason::user_shutdown);
    return trusted;
  };
  CHECK_FALSE(data_plane_limits{}.trusted_fabric);
  CHECK_FALSE(node_trusts());
  // The hook, which tests use instead, does.
  hooks->trusted_fabric = true;
  CHECK(data_plane_limits{}.trusted_fabric);
  CHECK(node_trusts());
}
