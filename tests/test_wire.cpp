// The data plane's frames and its server's answers to bad input.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <poll.h>
#include <pthread.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cells.hpp"
#include "log_capture.hpp"
#include "wait.hpp"
#include "scenarios.hpp"
#include "net/data_plane.hpp"
#include "actors/variable_directory.hpp"
#include "config/loopback.hpp"
#include "actors/variable.hpp"
#include "core/wire_format.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

/// Waits up to `limit` for the peer to close `fd`: true if it did (EOF).
bool closed_by_peer(int fd, std::chrono::milliseconds limit) {
  pollfd pfd{fd, POLLIN, 0};
  if (poll(&pfd, 1, static_cast<int>(limit.count())) <= 0)
    return false;
  char byte;
  return recv(fd, &byte, 1, MSG_DONTWAIT) == 0;
}

std::unique_ptr<data_plane_server> serve(std::shared_ptr<variable_directory> dir,
                                         std::chrono::milliseconds idle,
                                         std::chrono::milliseconds frame) {
  data_plane_timeouts timeouts;
  timeouts.idle = idle;
  timeouts.frame = frame;
  return value_of(data_plane_server::start(std::move(dir), "127.0.0.1", 0, "test node", timeouts));
}

std::shared_ptr<variable_cell> scalar_cell(const std::string& name, float value) {
  return float_cell(name, {}, value);
}

} // namespace

TEST_CASE("data-plane headers are validated before anything is trusted", "[wire]") {
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::assign);
  REQUIRE(wire::describe_tensor(tensor::filled(dtype::float32, {2, 3}, 1), h));
  CHECK(h.payload_bytes == 24);
  CHECK(wire::validate(h).empty());
  CHECK(wire::shape_of(h) == shape_type{2, 3});
  auto bad = [&](auto mutate) {
    auto copy = h;
    mutate(copy);
    return wire::validate(copy);
  };
  CHECK(bad([](wire::header& x) { x.magic = 1; }).find("bad magic") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.kind = 99; }).find("unknown frame kind 99") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.dtype = 9; }).find("unknown dtype code 9") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.rank = 9; }).find("rank 9") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.dims[0] = -2; }).find("negative dimension") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.payload_bytes = 23; }).find("payload of 23 bytes") != std::string::npos);
  CHECK(bad([](wire::header& x) { x.name_len = 1 << 20; }).find("variable name of") != std::string::npos);
  CHECK(bad([](wire::header& x) {
          x.rank = 4;
          for (int i = 0; i < 4; ++i)
            x.dims[i] = int64_t{1} << 20; // 2^80 elements: must not wrap around
        }).find("more than 2^40") != std::string::npos);
  CHECK_FALSE(wire::describe_tensor(tensor{dtype::float32, shape_type(9, 1)}, h));
}

TEST_CASE("a node answers garbage on its data port with an error and keeps serving", "[wire][errors]") {
  processes_under_test c{{{"ps", 1}, {"worker", 1}}};
  auto s = c.connect("worker", 0);
  auto d = value_of(s.device("/job:ps/task:0"));
  auto v = value_of(s.variable("var", {}, initializer::constant(5)));
  require_ok(s.initialize({v}));
  auto info = value_of(s.ping("ps", 0));
  REQUIRE(info.data_port != 0);
  // a raw connection that sends a forged header
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(info.data_port);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  wire::header forged;
  forged.kind = static_cast<uint8_t>(wire::kind::assign);
  forged.has_tensor = 1;
  forged.rank = 1;
  forged.dims[0] = 4;
  forged.payload_bytes = 1000; // does not match float32[4]
  REQUIRE(write(fd, &forged, sizeof(forged)) == static_cast<ssize_t>(sizeof(forged)));
  wire::header reply;
  REQUIRE(recv(fd, &reply, sizeof(reply), MSG_WAITALL) == static_cast<ssize_t>(sizeof(reply)));
  CHECK(reply.kind == static_cast<uint8_t>(wire::kind::reply));
  CHECK(reply.status == static_cast<uint8_t>(af_error::invalid_argument));
  std::string text(reply.payload_bytes, '\0');
  REQUIRE(recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
  CHECK(text.find("payload of 1000 bytes") != std::string::npos);
  char byte;
  CHECK(recv(fd, &byte, 1, 0) == 0); // and it hung up
  close(fd);
  // the node, and the variable, are fine
  CHECK(value_of(s.run(v)).at(0) == 5);
  // a variable nobody initialized, read over the data plane, is named in the error
  auto other = c.connect("worker", 0);
  auto od = value_of(other.device("/job:ps/task:0"));
  auto ghost = value_of(other.variable("ghost", {}));
  auto read = other.run(ghost);
  REQUIRE_FALSE(read);
  CHECK(is(read.error(), af_error::uninitialized));
  CHECK(describe(read.error()).find("'ghost'") != std::string::npos);
}

TEST_CASE("a node does not keep a thread (and its stack) for every client that came and went",
          "[wire]") {
  // An exited thread that nobody joined keeps its stack mapped: count the
  // read-write mappings the size of a default thread stack (malloc arenas,
  // which contention can add, are another size).
  auto thread_stacks = [] {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    size_t stack = 0;
    pthread_attr_getstacksize(&attr, &stack);
    pthread_attr_destroy(&attr);
    std::ifstream in{"/proc/self/maps"};
    std::string line;
    long count = 0;
    while (std::getline(in, line)) {
      auto dash = line.find('-'), space = line.find(' ');
      auto lo = std::stoull(line.substr(0, dash), nullptr, 16);
      auto hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      if (line.compare(space + 1, 4, "rw-p") == 0 && hi - lo <= stack && hi - lo + 65536 >= stack)
        ++count;
    }
    return count;
  };
  embedded_under_test c{{{"local", 2}}};
  {
    auto s = c.connect("local", 0);
    auto d = value_of(s.device("/job:local/task:1"));
    require_ok(s.initialize({value_of(s.variable("v", {}, initializer::constant(1)))}));
  }
  long after_first = -1;
  for (int i = 0; i < 30; ++i) {
    auto s = c.connect("local", 0); // its reads go over task 1's data plane
    auto d = value_of(s.device("/job:local/task:1"));
    auto v = value_of(s.variable("v", {}));
    CHECK(value_of(s.run(v)).at(0) == 1);
    if (i == 0)
      after_first = thread_stacks();
  }
  // glibc caches a few stacks of joined threads; 30 leaked ones would show
  CHECK(thread_stacks() < after_first + 10);
}

TEST_CASE("a data-plane peer that stalls inside a frame is dropped, an idle one only after the idle timeout",
          "[wire][errors]") {
  auto dir = std::make_shared<variable_directory>();
  dir->put("v", {variable_cell_actor{}, scalar_cell("v", 5)});
  auto srv = serve(dir, 60s, 200ms);
  // half a header, then nothing
  int stalled = connect_loopback(srv->port());
  REQUIRE(stalled >= 0);
  wire::header h;
  h.kind = wire::request_kind(var_op::read);
  h.name_len = 1;
  REQUIRE(write(stalled, &h, sizeof(h) / 2) == static_cast<ssize_t>(sizeof(h) / 2));
  auto start = std::chrono::steady_clock::now();
  // A connection with nothing sent yet is idle, not stalled: it stays.
  int idle = connect_loopback(srv->port());
  REQUIRE(idle >= 0);
  CHECK(closed_by_peer(stalled, 5s)); // without a frame timeout it would stay forever
  CHECK(std::chrono::steady_clock::now() - start >= 150ms);
  close(stalled);
  CHECK_FALSE(closed_by_peer(idle, 600ms)); // three frame timeouts of silence: still open
  // and it is served when it speaks
  wire::header read;
  read.kind = wire::request_kind(var_op::read);
  read.name_len = 1;
  REQUIRE(write(idle, &read, sizeof(read)) == static_cast<ssize_t>(sizeof(read)));
  REQUIRE(write(idle, "v", 1) == 1);
  wire::header reply;
  REQUIRE(recv(idle, &reply, sizeof(reply), MSG_WAITALL) == static_cast<ssize_t>(sizeof(reply)));
  CHECK(reply.status == 0);
  float value = 0;
  REQUIRE(recv(idle, &value, sizeof(value), MSG_WAITALL) == static_cast<ssize_t>(sizeof(value)));
  CHECK(value == 5);
  close(idle);

  // With a short idle timeout, a silent client is closed...
  auto brief = serve(dir, 300ms, 5s);
  auto ch = value_of(data_channel::connect("127.0.0.1", brief->port(), "test node", 5s));
  CHECK(value_of(ch->call(var_op::read, "v", nullptr, true)).first.at(0) == 5);
  int silent = connect_loopback(brief->port()); // connected after the channel's last op
  REQUIRE(silent >= 0);
  CHECK(closed_by_peer(silent, 5s));
  close(silent);
  // ...and a channel quiet for that long reconnects instead of failing its next op.
  auto again = ch->call(var_op::read, "v", nullptr, true);
  REQUIRE(again);
  CHECK(again->first.at(0) == 5);
  CHECK_FALSE(ch->broken());
}

TEST_CASE("a status byte that is no af_error fails the call with internal", "[wire][errors]") {
  // A fake node: answers any request with status 200 (or, second, not_found).
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(listener, 4) == 0);
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  auto port = ntohs(addr.sin_port);
  std::thread fake{[listener] {
    for (uint8_t status : {uint8_t{200}, static_cast<uint8_t>(af_error::not_found)}) {
      int fd = accept(listener, nullptr, nullptr);
      if (fd < 0)
        return;
      wire::header request;
      std::string name(1, '\0');
      if (recv(fd, &request, sizeof(request), MSG_WAITALL) == sizeof(request)) {
        name.resize(request.name_len);
        recv(fd, name.data(), name.size(), MSG_WAITALL);
        std::string text = "no such thing";
        wire::header reply;
        reply.kind = static_cast<uint8_t>(wire::kind::reply);
        reply.status = status;
        reply.payload_bytes = text.size();
        [[maybe_unused]] auto n = write(fd, &reply, sizeof(reply));
        n = write(fd, text.data(), text.size());
        char byte;
        recv(fd, &byte, 1, 0); // until the client hangs up
      }
      close(fd);
    }
  }};
  {
    auto ch = value_of(data_channel::connect("127.0.0.1", port, "the fake node", 5s));
    auto r = ch->call(var_op::read, "v", nullptr, true);
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::internal));
    CHECK(describe(r.error()).find("peer sent an invalid status byte 200") != std::string::npos);
    CHECK(ch->broken()); // the stream is not trusted after that
  }
  {
    auto ch = value_of(data_channel::connect("127.0.0.1", port, "the fake node", 5s));
    auto r = ch->call(var_op::read, "v", nullptr, true);
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::not_found)); // a valid code passes through with its text
    CHECK(describe(r.error()) == "not_found: no such thing");
    CHECK_FALSE(ch->broken());
  }
  fake.join();
  close(listener);
}

TEST_CASE("a variable removed from the directory is no longer served by name", "[wire]") {
  auto dir = std::make_shared<variable_directory>();
  dir->put("w", {variable_cell_actor{}, scalar_cell("w", 2)});
  auto srv = serve(dir, 60s, 5s);
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 5s));
  auto three = tensor::scalar(3);
  auto added = value_of(ch->call(var_op::assign_add, "w", &three, true));
  CHECK(added.first.at(0) == 5);
  CHECK(added.second == 2u);
  dir->remove("w");
  auto gone = ch->call(var_op::read, "w", nullptr, true);
  REQUIRE_FALSE(gone);
  CHECK(is(gone.error(), af_error::not_found));
  CHECK(describe(gone.error()).find("no variable 'w' on test node") != std::string::npos);
  CHECK_FALSE(ch->broken()); // an error reply, not a broken stream
}

TEST_CASE("a first value assigned over the data plane releases the variable's waiters",
          "[wire][variable]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  auto cell = std::make_shared<variable_cell>(
    variable_spec{"v", dtype::float32, {}, "/job:ps/replica:0/task:0/device:CPU:0"});
  auto var = sys.spawn(variable_impl, cell);
  auto dir = std::make_shared<variable_directory>();
  dir->put("v", {var, cell});
  auto srv = serve(dir, 60s, 5s);
  {
    caf::scoped_actor waiter{sys, true};
    caf::scoped_actor self{sys, true};
    auto pending = waiter->request(var, 20s, wait_init_atom::value, std::string{}, uint32_t{60000});
    auto parked = [&] {
      uint32_t n = 0;
      self->request(var, 5s, info_atom::value).receive([&](variable_info& i) { n = i.waiters; },
                                                       [&](caf::error& e) { FAIL(describe(e)); });
      return n == 1;
    };
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!parked() && std::chrono::steady_clock::now() < deadline)
      ; // ask again
    REQUIRE(parked());
    auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 5s));
    auto three = tensor::scalar(3);
    CHECK(value_of(ch->call(var_op::assign, "v", &three, false)).second == 1u);
    pending.receive([](uint64_t v) { CHECK(v == 1u); }, [&](caf::error& e) { FAIL(describe(e)); });
  }
  srv->stop();
  caf::anon_send_exit(var, caf::exit_reason::user_shutdown);
}

TEST_CASE("the data plane's timeouts are [node] options with generous defaults", "[wire][config]") {
  node_options defaults;
  CHECK(defaults.data_idle_timeout_ms == 600000);
  CHECK(defaults.data_frame_timeout_ms == 5000);
  auto cfg = value_of(parse_cluster_toml(
    "[cluster]\nps = [\"a:1\"]\n[node]\ndata_idle_timeout_ms = 30000\ndata_frame_timeout_ms = 200\n", "t"));
  CHECK(cfg.node.data_idle_timeout_ms == 30000);
  CHECK(cfg.node.data_frame_timeout_ms == 200);
  auto zero = parse_cluster_toml("[cluster]\nps = [\"a:1\"]\n[node]\ndata_idle_timeout_ms = 0\n", "t");
  REQUIRE_FALSE(zero); // "never" is no option: a dead client would hold a thread forever
  CHECK(describe(zero.error()).find("node.data_idle_timeout_ms = 0 is out of range") != std::string::npos);
  auto again = value_of(parse_cluster_toml(cfg.cluster.to_toml(cfg.node), "again"));
  CHECK(again.node.data_frame_timeout_ms == 200);
}

namespace {

/// This process's peak resident set (VmHWM) in KiB; reset_peak() starts it anew.
long peak_rss_kib() {
  std::ifstream status{"/proc/self/status"};
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0)
      return std::stol(line.substr(6));
  return -1;
}

bool reset_peak() {
  std::ofstream refs{"/proc/self/clear_refs"};
  refs << "5";
  return static_cast<bool>(refs);
}

} // namespace

TEST_CASE("an operand for a variable that is missing or of another shape is refused before the "
          "node allocates it",
          "[wire][errors]") {
  auto dir = std::make_shared<variable_directory>();
  dir->put("w", {variable_cell_actor{}, scalar_cell("w", 2)});
  auto srv = serve(dir, 60s, 5s);
  int fd = connect_loopback(srv->port());
  REQUIRE(fd >= 0);
  std::vector<char> chunk(1 << 20, 0);
  auto send_operand = [&](const std::string& name, int64_t elements) {
    wire::header h;
    h.kind = wire::request_kind(var_op::assign);
    h.name_len = static_cast<uint32_t>(name.size());
    REQUIRE(wire::describe_tensor(tensor{dtype::float32, {1}}, h));
    h.dims[0] = elements;
    h.payload_bytes = static_cast<uint64_t>(elements) * 4;
    REQUIRE(write(fd, &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h)));
    REQUIRE(write(fd, name.data(), name.size()) == static_cast<ssize_t>(name.size()));
    for (uint64_t left = h.payload_bytes; left > 0;) {
      auto n = std::min<uint64_t>(left, chunk.size());
      REQUIRE(send(fd, chunk.data(), n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
      left -= n;
    }
    wire::header reply;
    REQUIRE(recv(fd, &reply, sizeof(reply), MSG_WAITALL) == static_cast<ssize_t>(sizeof(reply)));
    std::string text(reply.payload_bytes, '\0');
    REQUIRE(recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
    return std::make_pair(reply.status, text);
  };
  const int64_t elements = 64 << 20; // 256 MiB of float32
  REQUIRE(reset_peak());
  auto before = peak_rss_kib();
  auto missing = send_operand("nope", elements);
  CHECK(missing.first == static_cast<uint8_t>(af_error::not_found));
  CHECK(missing.second.find("'nope'") != std::string::npos);
  auto misfit = send_operand("w", elements);
  CHECK(misfit.first == static_cast<uint8_t>(af_error::shape_mismatch));
  CHECK(misfit.second.find("[67108864]") != std::string::npos);
  // Reading into a buffer of the declared size would have raised the peak by 256 MiB.
  CHECK(peak_rss_kib() - before < 64 * 1024);
  close(fd);
}

TEST_CASE("a refused request that declares more payload than the node skips is answered at once "
          "and its connection closed",
          "[wire][errors]") {
  // The bug this catches: the node read past a refused payload whatever its
  // size, so a peer declaring 4 TiB and sending nothing got no answer, only
  // a closed connection after the frame timeout (60 s here, the test's limit
  // is the 120 s ctest timeout; the answer must come long before).
  auto dir = std::make_shared<variable_directory>();
  auto srv = serve(dir, 60s, 60s);
  for (auto kind : {wire::kind::push, static_cast<wire::kind>(wire::request_kind(var_op::assign))}) {
    INFO("frame kind " << static_cast<int>(kind));
    int fd = connect_loopback(srv->port());
    REQUIRE(fd >= 0);
    timeval limit{30, 0}; // a bound on the test, not the behaviour's timing
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    // A push's name starts with its worker's token and push number.
    const std::string name =
      (kind == wire::kind::push ? std::string(sizeof(wire::push_prefix), '\0') : "") + "nope";
    wire::header h;
    h.kind = static_cast<uint8_t>(kind);
    h.name_len = static_cast<uint32_t>(name.size());
    REQUIRE(wire::describe_tensor(tensor{dtype::float32, {1}}, h));
    h.dims[0] = int64_t{1} << 40; // 4 TiB of float32, never sent
    h.payload_bytes = (uint64_t{1} << 40) * 4;
    REQUIRE(wire::validate(h).empty());
    REQUIRE(write(fd, &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h)));
    REQUIRE(write(fd, name.data(), name.size()) == static_cast<ssize_t>(name.size()));
    wire::header reply;
    REQUIRE(recv(fd, &reply, sizeof(reply), MSG_WAITALL) == static_cast<ssize_t>(sizeof(reply)));
    CHECK(reply.status == static_cast<uint8_t>(af_error::not_found));
    std::string text(reply.payload_bytes, '\0');
    REQUIRE(recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
    CHECK(text.find("'nope'") != std::string::npos);
    CHECK(text.find("connection is closed") != std::string::npos);
    char byte;
    CHECK(recv(fd, &byte, 1, 0) == 0); // closed by the node
    close(fd);
  }
}

namespace {

/// A request frame: header, name, and `value`'s bytes if given.
std::string request_bytes(var_op op, const std::string& name, const tensor* value) {
  wire::header h;
  h.kind = wire::request_kind(op);
  h.name_len = static_cast<uint32_t>(name.size());
  h.want_value = 1;
  if (value != nullptr)
    REQUIRE(wire::describe_tensor(*value, h));
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out += name;
  if (value != nullptr)
    out.append(reinterpret_cast<const char*>(value->bytes()), value->nbytes());
  return out;
}

/// One reply frame off `fd`: its status, and its payload as floats.
std::pair<int, std::vector<float>> read_reply(int fd) {
  wire::header r;
  REQUIRE(recv(fd, &r, sizeof(r), MSG_WAITALL) == static_cast<ssize_t>(sizeof(r)));
  std::vector<float> values(r.payload_bytes / sizeof(float));
  std::string rest(r.payload_bytes - values.size() * sizeof(float), '\0');
  if (!values.empty())
    REQUIRE(recv(fd, values.data(), values.size() * sizeof(float), MSG_WAITALL)
            == static_cast<ssize_t>(values.size() * sizeof(float)));
  if (!rest.empty())
    REQUIRE(recv(fd, rest.data(), rest.size(), MSG_WAITALL) == static_cast<ssize_t>(rest.size()));
  return {r.status, values};
}

} // namespace

// A served plaintext connection reads ahead: a small request costs one recv
// (net/byte_channel.cpp, tcp_read_ahead_channel). Bugs it catches: bytes of
// the next frame taken with this one and then lost or read twice (the
// second request would never be answered, or answered as garbage), and a
// payload begun in the buffer and finished straight into the tensor with
// bytes dropped or shifted at the seam.
TEST_CASE("a node answers small and large requests sent back to back in one write in their order",
          "[wire]") {
  auto dir = std::make_shared<variable_directory>();
  dir->put("v", {variable_cell_actor{}, scalar_cell("v", 5)});
  const int64_t n = 3001; // 12 KiB: more than the read-ahead buffer, and not a multiple of it
  dir->put("big", {variable_cell_actor{}, float_cell("big", {n}, 0)});
  auto srv = serve(dir, 60s, 5s);
  int fd = connect_loopback(srv->port());
  REQUIRE(fd >= 0);
  timeval limit{20, 0}; // a bound on the test, not the behaviour's timing
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  auto values = tensor::filled(dtype::float32, {n}, 0);
  for (int64_t i = 0; i < n; ++i)
    values.mutable_data<float>()[i] = static_cast<float>(i) + 0.5f;
  auto two = tensor::scalar(2);
  std::string all = request_bytes(var_op::read, "v", nullptr)
                    + request_bytes(var_op::assign, "big", &values)
                    + request_bytes(var_op::assign_add, "v", &two)
                    + request_bytes(var_op::read, "big", nullptr)
                    + request_bytes(var_op::read, "v", nullptr);
  REQUIRE(send(fd, all.data(), all.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(all.size()));
  auto first = read_reply(fd);
  CHECK(first.first == 0);
  CHECK(first.second == std::vector<float>{5});
  auto assigned = read_reply(fd);
  CHECK(assigned.first == 0);
  CHECK(assigned.second.size() == static_cast<size_t>(n));
  auto added = read_reply(fd);
  CHECK(added.first == 0);
  CHECK(added.second == std::vector<float>{7});
  auto big = read_reply(fd);
  CHECK(big.first == 0);
  REQUIRE(big.second.size() == static_cast<size_t>(n));
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i)
    wrong += big.second[i] != static_cast<float>(i) + 0.5f ? 1 : 0;
  CHECK(wrong == 0);
  CHECK(read_reply(fd).second == std::vector<float>{7});
  close(fd);
}

// Bug it catches: a connection moved to shared memory (or UCX) with bytes
// its client sent past the offer still in the read-ahead buffer: they would
// be lost without a word. A client of ours waits for the answer to its
// offer, so these are refused, and the connection closed.
TEST_CASE("bytes sent past an offer of shared memory or UCX before its answer are refused",
          "[wire][errors]") {
  auto dir = std::make_shared<variable_directory>();
  auto srv = serve(dir, 60s, 5s);
  for (auto kind : {wire::kind::shm_offer, wire::kind::ucx_offer}) {
    bool shm = kind == wire::kind::shm_offer;
    INFO((shm ? "shared memory" : "UCX"));
    int fd = connect_loopback(srv->port());
    REQUIRE(fd >= 0);
    timeval limit{20, 0}; // a bound on the test, not the behaviour's timing
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    wire::header h;
    h.kind = static_cast<uint8_t>(kind);
    std::string name = shm ? "/actorflow-no-such-segment" : "";
    h.name_len = static_cast<uint32_t>(name.size());
    h.version = shm ? 64 << 10 : 0;
    std::string all(reinterpret_cast<const char*>(&h), sizeof(h));
    all += name + "ahead of the answer";
    REQUIRE(send(fd, all.data(), all.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(all.size()));
    wire::header reply;
    REQUIRE(recv(fd, &reply, sizeof(reply), MSG_WAITALL) == static_cast<ssize_t>(sizeof(reply)));
    CHECK(reply.status == static_cast<uint8_t>(af_error::invalid_argument));
    std::string text(reply.payload_bytes, '\0');
    REQUIRE(recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
    CHECK(text.find(std::string{"bytes after an offer of "} + (shm ? "shared memory" : "UCX"))
          != std::string::npos);
    char byte;
    CHECK(recv(fd, &byte, 1, 0) == 0); // closed by the node
    close(fd);
  }
}

// A session's channel looks for a small op's reply a moment before it
// sleeps, and on a plain socket its looks read the reply's header
// themselves (data_channel::poll_for_reply). Bugs it catches: the header
// bytes a look took lost, read again from the socket or put at the wrong
// place (every reply would then be garbage or wait for bytes that never
// come). The look lasts up to a second here, so the reply of an op on this
// host always comes within it.
TEST_CASE("a channel that looks for its replies before it sleeps reads them whole", "[wire]") {
  auto dir = std::make_shared<variable_directory>();
  dir->put("v", {variable_cell_actor{}, scalar_cell("v", 5)});
  const int64_t n = 1000;
  dir->put("big", {variable_cell_actor{}, float_cell("big", {n}, 1.5f)});
  auto srv = serve(dir, 60s, 5s);
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 20s, 1s,
                                           nullptr, nullptr, false));
  auto one = tensor::scalar(1);
  for (int i = 1; i <= 20; ++i) {
    auto added = value_of(ch->call(var_op::assign_add, "v", &one, true));
    CHECK(added.first.at(0) == 5 + i);
    auto big = value_of(ch->call(var_op::read, "big", nullptr, true)).first;
    REQUIRE(big.num_elements() == static_cast<size_t>(n));
    CHECK(big.at(n - 1) == 1.5);
  }
  CHECK_FALSE(ch->broken());
}

// Bug it catches: a plaintext client that hangs up (or is killed) part way
// through a frame's name or payload closed without a word in the node's log,
// where a stall says "stopped sending in the middle of a frame's payload"
// and a TLS client's truncated record is named: an operator saw a request
// vanish with nothing to tell why.
namespace {

/// A node serving "big" (float32[3001], zeros) with its log captured from
/// before it started (its threads log into spdlog's sinks, which must not
/// change under them), and an assign_add frame of ones for "big".
struct big_node {
  static constexpr int64_t n = 3001;
  std::shared_ptr<variable_directory> dir = std::make_shared<variable_directory>();
  af::test::log_capture logs;
  std::unique_ptr<data_plane_server> srv;
  std::string frame;

  explicit big_node(std::chrono::milliseconds frame_timeout) {
    dir->put("big", {variable_cell_actor{}, float_cell("big", {n}, 0)});
    srv = serve(dir, 60s, frame_timeout);
    auto values = tensor::filled(dtype::float32, {n}, 1);
    frame = request_bytes(var_op::assign_add, "big", &values);
  }
};

/// "127.0.0.1:PORT" of this end of `fd`, as the node's log names it.
std::string local_peer(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

} // namespace

TEST_CASE("a client that hangs up in the middle of a frame's payload is named in the node's log",
          "[wire][errors]") {
  big_node node{5s};
  const auto n = big_node::n;
  auto& logs = node.logs;
  auto& srv = node.srv;
  const auto& frame = node.frame;
  for (size_t cut : {sizeof(wire::header) + 1, sizeof(wire::header) + 3 + 100, size_t{5000}}) {
    INFO("cut after " << cut << " bytes");
    int fd = connect_loopback(srv->port());
    REQUIRE(fd >= 0);
    auto peer = local_peer(fd);
    REQUIRE(send(fd, frame.data(), cut, MSG_NOSIGNAL) == static_cast<ssize_t>(cut));
    close(fd);
    CHECK(eventually([&] { return logs.has(peer, "hung up in the middle of a frame's"); }, 10s));
  }
  // Nothing was applied.
  int fd = connect_loopback(srv->port());
  REQUIRE(fd >= 0);
  timeval limit{20, 0}; // a bound on the test, not the behaviour's timing
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  auto r = request_bytes(var_op::read, "big", nullptr);
  REQUIRE(send(fd, r.data(), r.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(r.size()));
  auto back = read_reply(fd);
  CHECK(back.first == 0);
  REQUIRE(back.second.size() == static_cast<size_t>(n));
  CHECK(back.second[0] == 0);
  CHECK(back.second[n - 1] == 0);
  close(fd);
}

namespace {

/// Whether a thread of this process sleeps in poll() (a served connection
/// inside a frame: between frames it sleeps in recv, the acceptor in accept).
bool a_thread_polls() {
  for (auto& task : std::filesystem::directory_iterator{"/proc/self/task"}) {
    std::ifstream in{task.path() / "wchan"};
    std::string wchan;
    std::getline(in, wchan);
    if (wchan.find("poll_schedule") != std::string::npos)
      return true;
  }
  return false;
}

} // namespace

// Bug it catches: the node's own stop, which shuts its connections down,
// logged as each client inside a frame "hung up in the middle of a frame".
TEST_CASE("a node that stops while a client is in the middle of a frame does not say the client "
          "hung up",
          "[wire][errors]") {
  big_node node{60s};
  auto& logs = node.logs;
  auto& srv = node.srv;
  const auto& frame = node.frame;
  int fd = connect_loopback(srv->port());
  REQUIRE(fd >= 0);
  auto peer = local_peer(fd);
  REQUIRE(send(fd, frame.data(), 5000, MSG_NOSIGNAL) == 5000);
  // Its thread has taken the header and waits for the rest of the payload.
  REQUIRE(eventually([] { return a_thread_polls(); }, 10s));
  srv->stop();
  CHECK_FALSE(logs.has(peer, "hung up"));
  close(fd);
}
