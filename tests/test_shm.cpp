// The data plane on shared memory between processes of one host (issue 12):
// the same frames, ops and errors as on TCP, a peer's death seen as fast, no
// segment left in /dev/shm, and no shared memory for a peer that is to be
// treated as another host.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <ctime>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cells.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "wait.hpp"
#include "net/data_plane.hpp"
#include "actors/variable_directory.hpp"
#include "actors/session.hpp"
#include "net/shm_ring.hpp"
#include "dist/embedded_cluster.hpp"
#include "actors/variable.hpp"
#include "core/wire_format.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

/// A node's data plane in this process with a scalar `v` (1) and a float32
/// `big` of `big_floats` elements (0).
struct local_node {
  std::shared_ptr<variable_directory> dir = std::make_shared<variable_directory>();
  std::unique_ptr<data_plane_server> srv;
  explicit local_node(int64_t big_floats, data_plane_limits limits = {}) {
    auto v = float_cell("v", {}, 1);
    auto big = float_cell("big", {big_floats}, 0);
    REQUIRE((v && big));
    dir->put("v", {variable_cell_actor{}, v});
    dir->put("big", {variable_cell_actor{}, big});
    srv = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "test node", limits));
  }
};

/// Our segments in /dev/shm made by process `pid`.
std::vector<std::string> segments_of(pid_t pid) {
  std::vector<std::string> found;
  std::string prefix = std::string{shm_channel::name_prefix + 1} + std::to_string(pid) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (auto* e = readdir(d))
      if (std::string{e->d_name}.rfind(prefix, 0) == 0)
        found.push_back(e->d_name);
    closedir(d);
  }
  return found;
}

/// A plain TCP connection to 127.0.0.1:`port` (-1 if none).
int connect_loopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/// Sends frame header `h` and `name` on socket `fd`, then reads the reply's
/// header and payload (bounded by the socket's receive timeout).
wire::header exchange_on_tcp(int fd, wire::header h, const std::string& name) {
  h.name_len = static_cast<uint32_t>(name.size());
  REQUIRE(send(fd, &h, sizeof(h), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h)));
  REQUIRE(send(fd, name.data(), name.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(name.size()));
  wire::header r;
  REQUIRE(recv(fd, &r, sizeof(r), MSG_WAITALL) == static_cast<ssize_t>(sizeof(r)));
  std::string payload(r.payload_bytes, '\0');
  if (!payload.empty())
    REQUIRE(recv(fd, payload.data(), payload.size(), MSG_WAITALL)
            == static_cast<ssize_t>(payload.size()));
  return r;
}

} // namespace

TEST_CASE("variable ops, a tensor many times the ring and error replies work alike over shared "
          "memory and TCP",
          "[shm]") {
  // Bugs it catches: a frame or payload cut or reordered across the ring's
  // wrap (the 64 MiB + 12 byte tensor is 16x the ring and ends off its
  // boundary), a version or value that differs from TCP's, an error reply
  // whose text or payload skipping leaves the rings out of step (the op after
  // an error must work), and a channel that says shared memory but is not.
  bool shm = GENERATE(true, false);
  INFO((shm ? "shared memory" : "tcp"));
  const int64_t floats = (int64_t{16} << 20) + 3;
  local_node node{floats};
  auto ch = value_of(data_channel::connect("127.0.0.1", node.srv->port(), "test node", 10s, {},
                                           nullptr, nullptr, shm));
  // The first op goes on TCP: the offer comes after the node's first answer.
  auto first = value_of(ch->call(var_op::read, "v", nullptr, false));
  CHECK(first.first.at(0) == 1);
  CHECK(ch->transport() == "tcp");
  auto one = tensor::scalar(2);
  auto added = value_of(ch->call(var_op::assign_add, "v", &one, true));
  CHECK(added.first.at(0) == 3);
  CHECK(ch->transport() == (shm ? "shared memory" : "tcp"));
  auto subbed = value_of(ch->call(var_op::assign_sub, "v", &one, true));
  CHECK(subbed.first.at(0) == 1);
  CHECK(subbed.second == added.second + 1); // one version per update

  // A tensor of many rings: every element distinct, read back bit-exact.
  tensor big{dtype::float32, {floats}};
  for (int64_t i = 0; i < floats; ++i)
    big.mutable_data<float>()[i] = static_cast<float>(i % 1000003) * 0.5f;
  REQUIRE(ch->call(var_op::assign, "big", &big, false));
  auto back = value_of(ch->call(var_op::read, "big", nullptr, false));
  REQUIRE(back.first.nbytes() == big.nbytes());
  CHECK(std::memcmp(back.first.bytes(), big.bytes(), big.nbytes()) == 0);
  // An update with the value sent back: both directions carry a big payload.
  auto doubled = value_of(ch->call(var_op::assign_add, "big", &big, true));
  CHECK(doubled.first.at(floats - 1) == 2 * big.at(floats - 1));
  CHECK(doubled.first.at(1234567) == 2 * big.at(1234567));

  // Errors: the node's code and text, and the channel goes on.
  auto missing = ch->call(var_op::read, "nope", nullptr, false);
  REQUIRE_FALSE(missing);
  CHECK(is(missing.error(), af_error::not_found));
  CHECK(describe(missing.error()).find("no variable 'nope'") != std::string::npos);
  // A refused operand of 4 MiB: its payload is skipped (through the ring on
  // shared memory) and the next op is served.
  auto wrong = tensor::filled(dtype::float32, {int64_t{1} << 20}, 1);
  auto refused = ch->call(var_op::assign, "big", &wrong, false);
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), af_error::shape_mismatch));
  CHECK_FALSE(ch->broken());
  auto after = value_of(ch->call(var_op::read, "v", nullptr, false));
  CHECK(after.first.at(0) == 1);
  CHECK(ch->transport() == (shm ? "shared memory" : "tcp"));
  // Nothing of this process's segments is left in /dev/shm.
  CHECK(segments_of(getpid()).empty());
}

TEST_CASE("a peer treated as another host never gets shared memory", "[shm]") {
  // Bugs it catches: an offer made although the caller or the environment
  // said no, or a node that takes one although its limits say no.
  local_node node{16};
  auto two_ops = [](data_channel& ch) {
    REQUIRE(ch.call(var_op::read, "v", nullptr, false));
    REQUIRE(ch.call(var_op::read, "v", nullptr, false));
    REQUIRE(ch.call(var_op::read, "v", nullptr, false));
  };
  SECTION("the caller says no") {
    auto ch = value_of(data_channel::connect("127.0.0.1", node.srv->port(), "test node", 5s, {},
                                             nullptr, nullptr, false));
    two_ops(*ch);
    CHECK(ch->transport() == "tcp");
  }
  SECTION("ACTORFLOW_DATA_SHM=off in the environment") {
    const char* was = std::getenv("ACTORFLOW_DATA_SHM");
    std::string saved = was != nullptr ? was : "";
    setenv("ACTORFLOW_DATA_SHM", "off", 1);
    auto ch = data_channel::connect("127.0.0.1", node.srv->port(), "test node", 5s);
    if (was != nullptr)
      setenv("ACTORFLOW_DATA_SHM", saved.c_str(), 1);
    else
      unsetenv("ACTORFLOW_DATA_SHM");
    auto c = value_of(std::move(ch));
    two_ops(*c);
    CHECK(c->transport() == "tcp");
  }
  SECTION("the node says no: the offer is declined and the ops go on over TCP") {
    data_plane_limits limits;
    limits.shared_memory = false;
    local_node tcp_only{16, limits};
    auto ch = value_of(data_channel::connect("127.0.0.1", tcp_only.srv->port(), "test node", 5s));
    two_ops(*ch);
    CHECK(ch->transport() == "tcp");
    CHECK(segments_of(getpid()).empty()); // the declined segment is gone too
  }
  SECTION("the same host: shared memory") {
    auto ch = value_of(data_channel::connect("127.0.0.1", node.srv->port(), "test node", 5s));
    two_ops(*ch);
    CHECK(ch->transport() == "shared memory");
  }
}

TEST_CASE("[node] max_shm_bytes = 0 keeps a node's clients of this host on TCP, the default gives "
          "them shared memory, and the session says which",
          "[shm]") {
  // Bugs it catches: the config key read but never handed to the data plane
  // (the default 1 GiB budget stays), and session::data_transport naming a
  // transport its channel does not use.
  for (int64_t budget : {int64_t{0}, int64_t{1} << 30}) {
    node_options opts;
    opts.max_shm_bytes = budget;
    auto pc = value_of(process_cluster::start({{"ps", 1}}, opts));
    cluster_client c{opts};
    auto s = value_of(session::make(*c.sys, pc->spec(), "/job:ps/task:0", session_options{}));
    output v;
    {
      auto d = value_of(s.device("/job:ps/task:0"));
      v = value_of(s.variable("v", {}, initializer::ones()));
    }
    auto inc = s.assign_add(v, s.constant(tensor::scalar(1.0f)));
    require_ok(s.initialize());
    const char* env = std::getenv("ACTORFLOW_DATA_SHM");
    bool shm_off = env != nullptr && std::string{env} == "off";
    std::string want = budget == 0 || shm_off ? "tcp" : "shared memory";
    INFO("max_shm_bytes = " << budget);
    // The trace of each op names the way it went: the op that moved the
    // channel to shared memory (the second) included.
    for (int i = 0; i < 2; ++i) {
      run_trace trace;
      value_of(s.run(std::vector<output>{inc}, &trace));
      REQUIRE(!trace.entries.empty());
      if (i == 1)
        CHECK(trace.entries.back().note == "sent by the client over data plane (" + want + ")");
    }
    CHECK(value_of(s.data_transport("ps", 0)) == want);
  }
}

TEST_CASE("a session says how its ops reach each node: its own node in this actor system by "
          "message, another node's data plane by shared memory",
          "[shm][data-plane]") {
  // Bugs it catches: an in-system node reported as reached over a data plane
  // (or the reverse), and a transport named before the move to shared
  // memory the channel makes at its next op.
  auto ec = value_of(embedded_cluster::start({{"ps", 1}, {"worker", 1}}));
  auto s = value_of(ec->session_for("worker", 0));
  CHECK(value_of(s.data_transport("worker", 0))
        == "CAF messages (the node runs in this process: no copy)");
  const char* env = std::getenv("ACTORFLOW_DATA_SHM");
  bool shm_off = env != nullptr && std::string{env} == "off";
  const char* ucx = std::getenv("ACTORFLOW_DATA_UCX"); // data-plane-tests-over-ucx forces UCX
  bool ucx_forced = ucx != nullptr && std::string{ucx} == "force";
  auto ps = value_of(s.data_transport("ps", 0));
  if (ucx_forced)
    CHECK(ps.rfind("ucx", 0) == 0);
  else
    CHECK(ps == (shm_off ? "tcp" : "shared memory"));
}

TEST_CASE("a node SIGKILLed in the middle of a 64 MiB assign on shared memory fails the call at "
          "once and leaves no segment in /dev/shm",
          "[shm][faults]") {
  // Bugs it catches: a writer that waits on the ring for room until its
  // timeout (30 s here) because it does not watch the socket, and a segment
  // left behind because its name was kept until the connection closed.
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
  auto ch = value_of(data_channel::connect("127.0.0.1", port, "/job:ps/task:0", 30s));
  REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  REQUIRE(ch->call(var_op::read, "v", nullptr, false));
  REQUIRE(ch->transport() == "shared memory");
  pid_t node_pid = pc->pid("ps", 0);

  // The node stops: the assign fills the ring and waits for room.
  REQUIRE(pc->signal("ps", 0, SIGSTOP));
  auto value = tensor::filled(dtype::float32, {n}, 2);
  blocking_call<caf::expected<std::pair<tensor, uint64_t>>> call{
    [&] { return ch->call(var_op::assign, "big", &value, false); }};
  // Asleep in its wait for room (not before the call, not done).
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
  CHECK(segments_of(getpid()).empty());
  CHECK(segments_of(node_pid).empty());
}

TEST_CASE("a client that dies in the middle of a payload on shared memory frees its connection at "
          "once",
          "[shm][faults]") {
  // Bug it catches: a node thread that waits for the rest of a payload in the
  // ring until its frame timeout (60 s here) because it watches only the
  // ring and not the socket, holding the node's only connection slot.
  data_plane_limits limits;
  limits.max_connections = 1;
  limits.frame = 60s;
  local_node node{16 << 20, limits};
  int fd = connect_loopback(node.srv->port());
  REQUIRE(fd >= 0);
  timeval bound{10, 0}; // a bound on the test, not the behaviour's timing
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
  // By hand, what a data_channel does: a first op on TCP, then the offer.
  wire::header read;
  read.kind = wire::request_kind(var_op::read);
  REQUIRE(exchange_on_tcp(fd, read, "v").status == 0);
  auto seg = value_of(shm_channel::create());
  wire::header offer;
  offer.kind = static_cast<uint8_t>(wire::kind::shm_offer);
  offer.version = seg->segment_bytes();
  auto took = exchange_on_tcp(fd, offer, seg->name());
  REQUIRE(took.status == 0);
  REQUIRE(took.version == 1);
  seg->unlink();
  // A 64 MiB assign of which 1 MiB comes through the ring; then this
  // "process" is gone: its socket closes and its mapping goes.
  const std::string name = "big";
  wire::header assign;
  assign.kind = wire::request_kind(var_op::assign);
  assign.name_len = static_cast<uint32_t>(name.size());
  REQUIRE(wire::describe_tensor(tensor{dtype::float32, {16 << 20}}, assign));
  std::vector<char> part(1 << 20, 0);
  iovec iov[3] = {{&assign, sizeof(assign)},
                  {const_cast<char*>(name.data()), name.size()},
                  {part.data(), part.size()}};
  shm_channel::bound b;
  b.deadline = std::chrono::steady_clock::now() + 10s;
  REQUIRE(seg->write(iov, 3, fd, b) == shm_channel::status::done);
  auto died = std::chrono::steady_clock::now();
  close(fd);
  seg.reset();
  // The node's only slot is free again at once: a new client is served.
  bool served = eventually(
    [&] {
      auto ch = data_channel::connect("127.0.0.1", node.srv->port(), "test node", 5s);
      return ch && static_cast<bool>((*ch)->call(var_op::read, "v", nullptr, false));
    },
    20s);
  auto took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - died);
  INFO("a new client was served " << took_ms.count() << " ms after the first one died");
  CHECK(served);
  CHECK(took_ms < 5s); // the frame timeout is 60 s
  CHECK(segments_of(getpid()).empty());
}

namespace {

/// "/dev/shm" + a segment's name.
std::string shm_path(const std::string& name) {
  return "/dev/shm" + name;
}

} // namespace

// Bugs it catches (attacker findings F1, F3, the hard link): the node
// checked a segment's size once, so a client that kept a descriptor and
// shrank it made the node's next touch a SIGBUS that killed the node and all
// its clients; a sparse segment on a full /dev/shm did the same at its first
// page; one segment under two names put two node threads on one ring.
TEST_CASE("a segment the client shrinks, leaves sparse or links twice fails its connection, not "
          "the node",
          "[shm][faults]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  shm_channel::bound b;
  b.deadline = std::chrono::steady_clock::now() + 5s;

  SECTION("shrunk to nothing after the node mapped it") {
    auto client = shm_channel::create(64 << 10);
    REQUIRE(client);
    int keep = ::open(shm_path((*client)->name()).c_str(), O_RDWR);
    REQUIRE(keep >= 0);
    auto node = shm_channel::open((*client)->name(), (*client)->segment_bytes());
    REQUIRE(node);
    REQUIRE(::ftruncate(keep, 0) == 0);
    ::close(keep);
    char buf[16];
    // Before the guard: SIGBUS here, the test process (a node) gone.
    CHECK((*node)->read(buf, sizeof(buf), sv[0], b) == shm_channel::status::corrupt);
    iovec one{buf, sizeof(buf)};
    CHECK((*node)->write(&one, 1, sv[0], b) == shm_channel::status::corrupt);
  }

  SECTION("sparse: its pages never reserved") {
    auto name = std::string{shm_channel::name_prefix} + std::to_string(::getpid()) + "-sparse";
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    uint64_t bytes = 4096 + 2 * (64 << 10);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    ::close(fd);
    auto node = shm_channel::open(name, bytes);
    REQUIRE_FALSE(node);
    CHECK_THAT(describe(node.error()), Catch::Contains("reserved") && Catch::Contains("posix_fallocate"));
    CHECK(::access(shm_path(name).c_str(), F_OK) != 0); // refused, and its name gone
  }

  SECTION("one segment under two names") {
    auto client = shm_channel::create(64 << 10);
    REQUIRE(client);
    auto second = (*client)->name() + "b";
    REQUIRE(::link(shm_path((*client)->name()).c_str(), shm_path(second).c_str()) == 0);
    auto node = shm_channel::open((*client)->name(), (*client)->segment_bytes());
    ::unlink(shm_path(second).c_str());
    REQUIRE_FALSE(node);
    CHECK_THAT(describe(node.error()), Catch::Contains("another name"));
  }
  ::close(sv[0]);
  ::close(sv[1]);
}

namespace {

/// A hostile client's own view of a segment it offered: it kept a
/// descriptor and maps the segment too, so that it can write any counter.
/// The layout is net/shm_ring.cpp's: a 4096-byte header (magic, ring bytes,
/// then the control of the client-to-node ring at 128 and of the
/// node-to-client ring at 256, each `head` at +0 and `tail` at +64).
struct forger {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  explicit forger(const shm_channel& client) : bytes(client.segment_bytes()) {
    int fd = ::open(shm_path(client.name()).c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    REQUIRE(base != MAP_FAILED);
  }
  ~forger() { ::munmap(base, bytes); }
  std::atomic<uint64_t>& at(size_t offset) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(base) + offset);
  }
  uint64_t& ring_bytes() { return *reinterpret_cast<uint64_t*>(static_cast<char*>(base) + 8); }
  std::atomic<uint64_t>& to_node_head() { return at(128); }
  std::atomic<uint64_t>& to_node_tail() { return at(128 + 64); }
  std::atomic<uint64_t>& to_client_head() { return at(256); }
  std::atomic<uint64_t>& to_client_tail() { return at(256 + 64); }
  /// The node's waiting flag for bytes on the ring to it (the futex word).
  std::atomic<uint32_t>& to_node_reader_waiting() {
    return *reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(base) + 128 + 8);
  }
};

} // namespace

// Bug it catches: a node that trusts the counters a client writes into the
// segment: a head or tail that says more than the ring holds (or moved
// backwards) would have the node read or write past its ring, or take
// garbage as frames. Each forged value must fail the connection as corrupt,
// at once, with no byte moved beyond what the caller asked.
TEST_CASE("a peer that forges the shared-memory ring's counters is refused, and nothing is read "
          "or written out of bounds",
          "[shm][faults]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  constexpr uint64_t ring = 64 << 10;
  auto client = value_of(shm_channel::create(ring));
  forger peer{*client};
  auto node = value_of(shm_channel::open(client->name(), client->segment_bytes()));
  shm_channel::bound b;
  b.deadline = std::chrono::steady_clock::now() + 5s;
  b.stall_ms = 2000;
  // The forger's view is the segment the two sides use: 5 honest bytes show
  // in its head, and reach the node.
  const char hello[] = "hello";
  iovec first{const_cast<char*>(hello), 5};
  REQUIRE(client->write(&first, 1, sv[1], b) == shm_channel::status::done);
  REQUIRE(peer.to_node_head().load() == 5);
  char got[5];
  REQUIRE(node->read(got, 5, sv[0], b) == shm_channel::status::done);
  REQUIRE(std::string(got, 5) == "hello");
  REQUIRE(peer.to_node_tail().load() == 5);
  // The node reads into the middle of a buffer: the bytes around it stay.
  std::vector<char> buf(3 * ring, 'G');
  auto guards_intact = [&] {
    return std::all_of(buf.begin(), buf.begin() + ring, [](char c) { return c == 'G'; })
           && std::all_of(buf.begin() + 2 * ring, buf.end(), [](char c) { return c == 'G'; });
  };
  auto read_ring = [&] {
    uint64_t moved = 0;
    auto st = node->read(buf.data() + ring, ring, sv[0], b, &moved);
    CHECK(moved <= ring);
    return st;
  };
  const auto t0 = std::chrono::steady_clock::now();

  SECTION("a head more than a ring ahead of the tail") {
    peer.to_node_head() = 5 + ring + 1;
    CHECK(read_ring() == shm_channel::status::corrupt);
  }
  SECTION("a head far past anything written") {
    peer.to_node_head() = uint64_t{1} << 62;
    CHECK(read_ring() == shm_channel::status::corrupt);
  }
  SECTION("a head that went backwards, behind the tail") {
    peer.to_node_head() = 4;
    CHECK(read_ring() == shm_channel::status::corrupt);
  }
  SECTION("the node's own tail moved by the peer, past the head") {
    peer.to_node_tail() = 6;
    CHECK(read_ring() == shm_channel::status::corrupt);
  }
  SECTION("a tail on the node's outgoing ring ahead of what the node wrote") {
    peer.to_client_tail() = 1000;
    std::vector<char> out(ring / 2, 'x');
    iovec one{out.data(), out.size()};
    uint64_t moved = 0;
    CHECK(node->write(&one, 1, sv[0], b, &moved) == shm_channel::status::corrupt);
    CHECK(moved <= ring);
  }
  SECTION("a tail on the node's outgoing ring far behind its head") {
    std::vector<char> out(ring, 'x');
    iovec one{out.data(), 100};
    REQUIRE(node->write(&one, 1, sv[0], b) == shm_channel::status::done);
    // 100 bytes written and none taken; a tail of -ring says the ring holds
    // 100 + ring bytes: more than it can.
    peer.to_client_tail() = uint64_t{0} - ring;
    one.iov_len = out.size();
    CHECK(node->write(&one, 1, sv[0], b) == shm_channel::status::corrupt);
  }
  SECTION("a ring size in the header changed after the node mapped it") {
    // The node keeps the size it checked at open(): a larger one in the
    // header now makes it read no further.
    peer.ring_bytes() = ring * 1024;
    peer.to_node_head() = 5 + 2 * ring;
    CHECK(read_ring() == shm_channel::status::corrupt);
  }
  // Refused at once: not after waiting out the bound.
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK(guards_intact());
  ::close(sv[0]);
  ::close(sv[1]);
}

namespace {

/// Adds IPv4 address `ip` to interface `name` ("lo", or an alias "lo:1")
/// of this thread's network namespace and brings it up.
bool add_address(const std::string& name, const char* ip) {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return false;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, name.c_str(), IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  bool ok = ::inet_pton(AF_INET, ip, &sin->sin_addr) == 1 && ::ioctl(s, SIOCSIFADDR, &ifr) == 0;
  ifreq flags{};
  std::strncpy(flags.ifr_name, name.c_str(), IFNAMSIZ - 1);
  ok = ok && ::ioctl(s, SIOCGIFFLAGS, &flags) == 0;
  flags.ifr_flags |= IFF_UP | IFF_RUNNING;
  ok = ok && ::ioctl(s, SIOCSIFFLAGS, &flags) == 0;
  ::close(s);
  return ok;
}

/// What a node's data plane answered to an offer of shared memory.
struct offer_outcome {
  std::string failed;      ///< the test's own setup failed: why
  int answer = -1;         ///< the reply's version: 1 taken, 0 declined
  bool still_named = false; ///< the segment's name is still in /dev/shm (not mapped)
};

/// Offers segment `seg` to the data plane at `server`:`port` over a TCP
/// connection from `from`, as a client's first frame.
offer_outcome offer_from(const char* from, const char* server, uint16_t port,
                         const shm_channel& seg) {
  offer_outcome out;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  ::inet_pton(AF_INET, server, &dst.sin_addr);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0
      || ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0) {
    out.failed = std::string{"cannot connect from "} + from + ": " + std::strerror(errno);
    if (fd >= 0)
      ::close(fd);
    return out;
  }
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::shm_offer);
  h.name_len = static_cast<uint32_t>(seg.name().size());
  h.version = seg.segment_bytes();
  wire::header r;
  if (::send(fd, &h, sizeof(h), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(h))
      || ::send(fd, seg.name().data(), seg.name().size(), MSG_NOSIGNAL)
           != static_cast<ssize_t>(seg.name().size())
      || ::recv(fd, &r, sizeof(r), MSG_WAITALL) != static_cast<ssize_t>(sizeof(r)))
    out.failed = std::string{"no answer to the offer: "} + std::strerror(errno);
  else
    out.answer = static_cast<int>(r.version);
  out.still_named = ::access(shm_path(seg.name()).c_str(), F_OK) == 0;
  ::close(fd);
  return out;
}

} // namespace

// Needs root (a network namespace of its own, with two non-loopback
// addresses: the peer at one is "another host" to the node at the other,
// as shm_channel::same_host() sees it).
// Bug it catches: a node that maps whatever segment an offer names, whoever
// sends it: a peer on another host has no segment here, but can name one of
// a client of this host (the names are in /dev/shm for a moment) and so take
// over, or tear down, that client's rings.
TEST_CASE("the data-plane server refuses an offer of shared memory from a peer on another host",
          "[shm][root]") {
  if (::geteuid() != 0) {
    WARN("skipped: needs root for a network namespace of its own");
    return;
  }
  auto seg_remote = value_of(shm_channel::create(64 << 10));
  auto seg_local = value_of(shm_channel::create(64 << 10));
  offer_outcome remote, local;
  std::string setup;
  // The namespace is this thread's alone: the node and both peers live in it.
  std::thread in_namespace{[&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      setup = std::string{"unshare(CLONE_NEWNET): "} + std::strerror(errno);
      return;
    }
    if (!add_address("lo", "127.0.0.1") || !add_address("lo:1", "10.250.0.1")
        || !add_address("lo:2", "10.250.0.2")) {
      setup = std::string{"cannot add addresses: "} + std::strerror(errno);
      return;
    }
    auto dir = std::make_shared<variable_directory>();
    auto srv = data_plane_server::start(dir, "10.250.0.1", 0, "test node", {});
    if (!srv) {
      setup = "the data plane did not start: " + describe(srv.error());
      return;
    }
    remote = offer_from("10.250.0.2", "10.250.0.1", (*srv)->port(), *seg_remote);
    // The control: the same offer from the node's own address is taken.
    local = offer_from("10.250.0.1", "10.250.0.1", (*srv)->port(), *seg_local);
    (*srv)->stop();
  }};
  in_namespace.join();
  if (!setup.empty()) {
    WARN("skipped: " << setup);
    return;
  }
  INFO(remote.failed << local.failed);
  REQUIRE(remote.failed.empty());
  REQUIRE(local.failed.empty());
  CHECK(local.answer == 1);
  CHECK(remote.answer == 0);     // declined
  CHECK(remote.still_named);     // and never mapped (a mapping removes the name)
}

// Bug it catches (finding F2): doorbell bytes were drained without bound, so
// a client that flooded its socket kept a node thread (and a core) busy for
// ever and was never dropped.
TEST_CASE("a flood of doorbell bytes on a shared-memory connection fails it", "[shm][faults]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  auto client = shm_channel::create(64 << 10);
  REQUIRE(client);
  auto node = shm_channel::open((*client)->name(), (*client)->segment_bytes());
  REQUIRE(node);
  std::atomic<bool> stop{false};
  std::thread flood{[&] {
    std::string junk(4096, 'x');
    while (!stop.load())
      if (::send(sv[1], junk.data(), junk.size(), MSG_NOSIGNAL) < 0)
        break;
  }};
  shm_channel::bound b;
  b.deadline = std::chrono::steady_clock::now() + 5s;
  b.spin = std::chrono::microseconds{0};
  char buf[8];
  auto st = (*node)->read(buf, sizeof(buf), sv[0], b);
  stop = true;
  ::shutdown(sv[0], SHUT_RDWR);
  flood.join();
  CHECK(st == shm_channel::status::corrupt);
  ::close(sv[0]);
  ::close(sv[1]);
}

namespace {

/// CPU time this thread has used.
std::chrono::nanoseconds thread_cpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds{ts.tv_sec} + std::chrono::nanoseconds{ts.tv_nsec};
}

} // namespace

// Bugs it catches: a node asleep on the futex took any return but a timeout
// (the word changed under it: EAGAIN; a wake-up) as "the peer moved on" and
// looked again at once, counting nothing, so a client that keeps writing the
// word (or waking it) kept a node thread spinning until its deadline.
TEST_CASE("a peer that keeps writing a sleeper's futex word fails the connection, without a busy "
          "wait until the deadline",
          "[shm][faults]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  auto client = value_of(shm_channel::create(64 << 10));
  forger peer{*client};
  auto node = value_of(shm_channel::open(client->name(), client->segment_bytes()));
  shm_channel::bound b;
  b.spin = std::chrono::microseconds{0};
  b.futex_ms = 60000;
  char buf[8];
  {
    // Asleep on the futex alone, never looking by itself before the deadline.
    b.check_ms = 60000;
    b.deadline = std::chrono::steady_clock::now() + 3s;
    std::atomic<bool> stop{false};
    std::thread hostile{[&] {
      auto& word = peer.to_node_reader_waiting();
      for (uint32_t v = 7; !stop.load(); ++v) {
        word.store(v | 4); // never a value the node sleeps on
        ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
      }
    }};
    auto cpu0 = thread_cpu();
    auto t0 = std::chrono::steady_clock::now();
    auto st = node->read(buf, sizeof(buf), sv[0], b);
    auto took = std::chrono::steady_clock::now() - t0;
    auto cpu = thread_cpu() - cpu0;
    stop = true;
    hostile.join();
    INFO("took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                 << " ms, " << std::chrono::duration_cast<std::chrono::milliseconds>(cpu).count()
                 << " ms of CPU");
    // Refused as a flood, long before the deadline.
    CHECK(st == shm_channel::status::corrupt);
    CHECK(took < 2s);
  }
  ::close(sv[0]);
  ::close(sv[1]);
}

// Bug it catches (attacker finding F5, its node side): a node mapped every
// segment offered, with no budget for all its clients together; and a
// budget that is never given back when a connection ends.
TEST_CASE("a node maps at most max_shm_bytes of its clients' segments at once, and takes more "
          "when one leaves",
          "[shm]") {
  data_plane_limits limits;
  limits.max_shm_bytes = 10 << 20; // one default segment (8 MiB + 4 KiB), not two
  local_node node{16, limits};
  auto on = [&] {
    auto ch = value_of(data_channel::connect("127.0.0.1", node.srv->port(), "test node", 5s));
    for (int i = 0; i < 3; ++i)
      REQUIRE(ch->call(var_op::read, "v", nullptr, false));
    return ch;
  };
  auto first = on();
  CHECK(first->transport() == "shared memory");
  {
    auto second = on(); // over the budget: served, on TCP
    CHECK(second->transport() == "tcp");
  }
  first.reset(); // its connection ends; the node's thread gives its share back
  bool again = eventually([&] { return on()->transport() == "shared memory"; }, 5s);
  CHECK(again);
  CHECK(segments_of(getpid()).empty());
}

namespace {

/// Both ends of one shared-memory channel in this process, each with its own
/// end of a socketpair per direction as its doorbell (so that a side's read
/// and write may run on two threads without taking each other's bells).
struct ring_pair {
  std::unique_ptr<shm_channel> client, node;
  int to_node[2] = {-1, -1};   ///< [0]: the client writes, [1]: the node reads
  int to_client[2] = {-1, -1}; ///< [0]: the node writes, [1]: the client reads
  ring_pair() {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, to_node) == 0);
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, to_client) == 0);
    client = value_of(shm_channel::create(64 << 10));
    node = value_of(shm_channel::open(client->name(), client->segment_bytes()));
  }
  ~ring_pair() {
    for (int fd : {to_node[0], to_node[1], to_client[0], to_client[1]})
      ::close(fd);
  }
};

/// A bound that never spins (each wait sleeps unless its bytes are there)
/// and sleeps as `how` says: on the futex alone, or in poll on the doorbell
/// at once, and never looks again by itself before `deadline` (one for a
/// whole section): a wake-up the peer forgets leaves that side asleep until
/// then, and every wait after it times out.
shm_channel::bound sleeper(const std::string& how, std::chrono::steady_clock::time_point deadline) {
  shm_channel::bound b;
  b.deadline = deadline;
  b.spin = std::chrono::microseconds{0};
  b.futex_ms = how == "futex" ? 60000 : 0;
  b.check_ms = 60000;
  return b;
}

iovec bytes_of(void* p, size_t n) {
  return {p, n};
}

} // namespace

TEST_CASE("a side asleep on shared memory (futex or doorbell) is woken by its peer, and no wake-up "
          "is lost over many small frames both ways or a stream through a full ring",
          "[shm]") {
  // Bugs it catches: a writer that publishes without waking a reader asleep
  // on the futex (or in poll, without its doorbell byte), a reader that
  // frees room without waking a writer asleep for it, and a flag raised
  // after the last look (a wake-up lost between the look and the sleep):
  // each leaves a side asleep until the section's 20 s deadline (timeout).
  auto how = GENERATE(as<std::string>{}, "futex", "doorbell");
  INFO("asleep on the " << how);
  ring_pair rp;
  auto deadline = std::chrono::steady_clock::now() + 20s;

  SECTION("a reader asleep before anything is written is woken by the write") {
    uint64_t got = 0;
    auto b = sleeper(how, deadline);
    blocking_call<shm_channel::status> reader{
      [&] { return rp.node->read(&got, sizeof(got), rp.to_node[1], b); }};
    REQUIRE(reader.asleep(10s));
    uint64_t sent = 42;
    auto iov = bytes_of(&sent, sizeof(sent));
    REQUIRE(rp.client->write(&iov, 1, rp.to_node[0], sleeper(how, deadline))
            == shm_channel::status::done);
    CHECK(reader.join() == shm_channel::status::done);
    CHECK(got == 42);
    // Woken by the write, not by its deadline (then it finds the bytes too).
    CHECK(reader.ended() < b.deadline);
  }

  SECTION("20000 ping-pongs of 8-byte frames") {
    constexpr uint64_t rounds = 20000;
    std::atomic<uint64_t> answered{0};
    std::thread node{[&] {
      for (uint64_t i = 0; i < rounds; ++i) {
        uint64_t x = 0;
        auto st = rp.node->read(&x, sizeof(x), rp.to_node[1], sleeper(how, deadline));
        if (st != shm_channel::status::done)
          return;
        ++x;
        auto iov = bytes_of(&x, sizeof(x));
        st = rp.node->write(&iov, 1, rp.to_client[0], sleeper(how, deadline));
        if (st != shm_channel::status::done)
          return;
        answered = i + 1;
      }
    }};
    uint64_t i = 0;
    auto st = shm_channel::status::done;
    for (; i < rounds && st == shm_channel::status::done; ++i) {
      uint64_t x = i * 2;
      auto iov = bytes_of(&x, sizeof(x));
      st = rp.client->write(&iov, 1, rp.to_node[0], sleeper(how, deadline));
      if (st == shm_channel::status::done)
        st = rp.client->read(&x, sizeof(x), rp.to_client[1], sleeper(how, deadline));
      if (st == shm_channel::status::done && x != i * 2 + 1)
        FAIL("round " << i << ": " << x);
    }
    node.join();
    INFO("round " << i << ", the node answered " << answered.load());
    CHECK(st == shm_channel::status::done);
    CHECK(answered.load() == rounds);
  }

  SECTION("4 MiB each way at once through the 64 KiB rings, in small writes and reads") {
    constexpr uint64_t words = (uint64_t{4} << 20) / sizeof(uint64_t);
    // One side streams words 0, 1, 2, ... in writes of 1 to 61 words, the
    // other reads them in reads of 1 to 37: the rings fill (the writers
    // sleep for room) and empty (the readers sleep for bytes) many times.
    auto send = [&](shm_channel& ch, int fd) {
      std::vector<uint64_t> buf(61);
      for (uint64_t at = 0, k = 0; at < words; ++k) {
        uint64_t n = std::min<uint64_t>(words - at, 1 + k % 61);
        for (uint64_t j = 0; j < n; ++j)
          buf[j] = at + j;
        auto iov = bytes_of(buf.data(), n * sizeof(uint64_t));
        if (ch.write(&iov, 1, fd, sleeper(how, deadline)) != shm_channel::status::done)
          return false;
        at += n;
      }
      return true;
    };
    auto receive = [&](shm_channel& ch, int fd) {
      std::vector<uint64_t> buf(37);
      for (uint64_t at = 0, k = 0; at < words; ++k) {
        uint64_t n = std::min<uint64_t>(words - at, 1 + k % 37);
        auto st = ch.read(buf.data(), n * sizeof(uint64_t), fd, sleeper(how, deadline));
        if (st != shm_channel::status::done)
          return false;
        for (uint64_t j = 0; j < n; ++j)
          if (buf[j] != at + j)
            return false;
        at += n;
      }
      return true;
    };
    std::atomic<bool> ok[4] = {false, false, false, false};
    std::thread t[4] = {
      std::thread{[&] { ok[0] = send(*rp.client, rp.to_node[0]); }},
      std::thread{[&] { ok[1] = receive(*rp.node, rp.to_node[1]); }},
      std::thread{[&] { ok[2] = send(*rp.node, rp.to_client[0]); }},
      std::thread{[&] { ok[3] = receive(*rp.client, rp.to_client[1]); }},
    };
    for (auto& th : t)
      th.join();
    CHECK(ok[0]);
    CHECK(ok[1]);
    CHECK(ok[2]);
    CHECK(ok[3]);
  }
}
