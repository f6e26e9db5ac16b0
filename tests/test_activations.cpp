// Activations on the data plane (issue 12, part 2): a value that one
// partition produces and a partition on another node consumes travels as an
// edge frame on the consumer node's data plane (shared memory on one host,
// TCP otherwise, TLS with [security]), not as a CAF message; the trace says
// which way it came; a failed send fails the step at once, naming the edge;
// a hostile edge frame is refused and the node serves on.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "certs.hpp"
#include "scenarios.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"
#include "actors/data_plane.hpp"
#include "actors/executor.hpp"
#include "config/loopback.hpp"
#include "messages/wire.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

bool shm_off() {
  const char* v = std::getenv("ACTORFLOW_DATA_SHM");
  return v != nullptr && std::string{v} == "off";
}

/// x (fed) doubled on task 0, plus one on task 1: the doubled value is an
/// edge from task 0's partition to task 1's.
struct two_node_graph {
  output x, y, z;
  explicit two_node_graph(session& s, int64_t floats) {
    x = s.placeholder("x");
    {
      auto d = value_of(s.device("/job:local/task:0"));
      y = s.mul(x, s.constant(tensor::filled(dtype::float32, {floats}, 2)), "produce");
    }
    {
      auto d = value_of(s.device("/job:local/task:1"));
      z = s.add(y, s.constant(tensor::filled(dtype::float32, {floats}, 1)), "consume");
    }
  }
};

int raw_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

/// An edge frame's header and name for `device`, with a float32[floats]
/// payload declared (not sent); `name_bytes` < 24 cuts the name short.
void send_edge_head(int fd, const std::string& device, uint64_t floats, size_t name_bytes = SIZE_MAX) {
  wire::edge_prefix pre;
  pre.graph = 5;
  pre.op = 7;
  std::string name(sizeof(pre), '\0');
  std::memcpy(name.data(), &pre, sizeof(pre));
  name += device;
  if (name_bytes < name.size())
    name.resize(name_bytes);
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::edge);
  h.name_len = static_cast<uint32_t>(name.size());
  h.version = 77;
  h.has_tensor = 1;
  h.dtype = static_cast<uint8_t>(dtype::float32);
  h.rank = 1;
  h.dims[0] = static_cast<int64_t>(floats);
  h.payload_bytes = floats * 4;
  REQUIRE(send(fd, &h, sizeof(h), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h)));
  REQUIRE(send(fd, name.data(), name.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(name.size()));
}

/// The reply on a raw connection: its status and text; status 255 if the
/// node closed it or said nothing within 5 s.
std::pair<uint8_t, std::string> read_reply(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  if (poll(&pfd, 1, 5000) <= 0)
    return {255, "nothing within 5 s"};
  wire::header h;
  if (recv(fd, &h, sizeof(h), MSG_WAITALL) != static_cast<ssize_t>(sizeof(h)))
    return {255, "closed"};
  std::string text(std::min<uint64_t>(h.payload_bytes, 1 << 20), '\0');
  if (!text.empty())
    recv(fd, text.data(), text.size(), MSG_WAITALL);
  return {h.status, text};
}

void send_floats(int fd, uint64_t floats) {
  std::vector<float> v(floats, 1.f);
  REQUIRE(send(fd, v.data(), v.size() * 4, MSG_NOSIGNAL) == static_cast<ssize_t>(v.size() * 4));
}

} // namespace

#define CLUSTERS embedded_under_test, processes_under_test

// Catches: an edge between nodes that still goes as a CAF message (the trace
// would say "CAF message"), a value garbled on the way (wrong sum), a trace
// that does not say the transport, a channel that never moves to shared
// memory on one host (or does with ACTORFLOW_DATA_SHM=off).
TEMPLATE_TEST_CASE("a value between partitions on two nodes comes on the consumer node's data plane, "
                   "and the trace says which transport",
                   "[activation]", CLUSTERS) {
  TestType c{{{"local", 2}}};
  session s = c.connect("local", 0);
  const int64_t floats = 256 * 1024; // 1 MiB
  two_node_graph g{s, floats};
  std::string note;
  for (int step = 1; step <= 3; ++step) {
    run_trace trace;
    auto got = value_of(s.run({g.z}, {{g.x, tensor::filled(dtype::float32, {floats}, step)}}, &trace));
    REQUIRE(got[0].num_elements() == static_cast<size_t>(floats));
    CHECK(got[0].at(0) == 2 * step + 1);
    CHECK(got[0].at(floats - 1) == 2 * step + 1);
    auto e = trace.find("produce -> consume");
    REQUIRE(e != nullptr);
    INFO("step " << step << ": " << e->note);
    CHECK(e->kind == "transfer");
    CHECK(e->bytes_in == static_cast<uint64_t>(floats) * 4);
    CHECK(e->note.find("by data plane (") != std::string::npos);
    CHECK(e->note.find("CAF message") == std::string::npos);
    note = e->note;
  }
  // The first value opens the channel on TCP; from its first answer on, a
  // node on this host is reached through shared memory unless turned off.
  INFO(note);
  CHECK(note.find(shm_off() ? "by data plane (tcp) from " : "by data plane (shared memory) from ")
        != std::string::npos);
}

// Catches: a sender that opens a plaintext channel to a node with
// [security] (refused: the step would fail) or one that goes around TLS,
// and a trace that does not say the edge was on TLS.
TEST_CASE("with [security] a value between two node processes comes on the data plane over TLS",
          "[activation][tls]") {
  temp_dir dir;
  auto config = dir / "cluster.toml";
  std::string cluster = "[cluster]\nlocal = [\"127.0.0.1:" + std::to_string(free_loopback_port())
                        + "\", \"127.0.0.1:" + std::to_string(free_loopback_port()) + "\"]\n";
  write_file(config, cluster);
  write_file(config, cluster + "\n" + make_certs(config));
  std::vector<std::unique_ptr<background_process>> nodes;
  for (int task = 0; task < 2; ++task) {
    nodes.push_back(std::make_unique<background_process>(std::vector<std::string>{
      ACTORFLOW_NODE_BINARY, "--config", config, "--job", "local", "--task", std::to_string(task)}));
    REQUIRE(nodes.back()->wait_for("actorflow-node ready", 30s)); // waits for its ready line
  }
  auto loaded = value_of(load_cluster_config(config));
  auto sec = value_of(security_for(loaded.security, "client"));
  system_config cfg{node_options{}, sec};
  caf::actor_system sys{cfg};
  session_options so;
  so.security = sec;
  so.timeout = 30s;
  auto s = value_of(session::make(sys, loaded.cluster, "/job:local/task:0", so));
  two_node_graph g{s, 1024};
  for (int step = 1; step <= 2; ++step) {
    run_trace trace;
    auto got = value_of(s.run({g.z}, {{g.x, tensor::filled(dtype::float32, {1024}, step)}}, &trace));
    CHECK(got[0].at(1023) == 2 * step + 1);
    auto e = trace.find("produce -> consume");
    REQUIRE(e != nullptr);
    INFO(e->note);
    CHECK(e->note.find("by data plane (tls) from ") != std::string::npos);
  }
}

// Catches: values between executors of one node sent through a socket (or a
// CAF message) instead of handed over as a shared buffer; and with the data
// plane off, edges that stop flowing instead of going as CAF messages.
TEST_CASE("a value between partitions on one node stays a local buffer; with the data plane off, "
          "one between nodes goes as a CAF message",
          "[activation]") {
  auto opts = embedded_cluster::defaults();
  opts.cpu_devices = 2;
  embedded_under_test c{{{"local", 2}}, opts};
  SECTION("same node") {
    session s = c.connect("local", 0);
    auto x = s.placeholder("x");
    output y, z;
    {
      auto d = value_of(s.device("/job:local/task:0/device:CPU:0"));
      y = s.mul(x, s.constant(tensor::filled(dtype::float32, {4}, 2)), "produce");
    }
    {
      auto d = value_of(s.device("/job:local/task:0/device:CPU:1"));
      z = s.add(y, s.constant(tensor::filled(dtype::float32, {4}, 1)), "consume");
    }
    run_trace trace;
    auto got = value_of(s.run({z}, {{x, tensor::filled(dtype::float32, {4}, 3)}}, &trace));
    CHECK(got[0].at(3) == 7);
    auto e = trace.find("produce -> consume");
    REQUIRE(e != nullptr);
    INFO(e->note);
    CHECK(e->note.find("by local buffer") != std::string::npos);
  }
  SECTION("data plane off") {
    session_options so = c.defaults;
    so.data_plane = false;
    session s = c.connect("local", 0, so);
    two_node_graph g{s, 4};
    run_trace trace;
    auto got = value_of(s.run({g.z}, {{g.x, tensor::filled(dtype::float32, {4}, 3)}}, &trace));
    CHECK(got[0].at(0) == 7);
    auto e = trace.find("produce -> consume");
    REQUIRE(e != nullptr);
    INFO(e->note);
    // In one process: the nodes' actor systems differ, but no data plane is named.
    CHECK(e->note.find("data plane") == std::string::npos);
  }
}

// Catches: a send the consumer's node refuses that leaves the consumer
// waiting until the step timeout, or an error that does not say which value,
// where to, and why.
TEST_CASE("a value over the consumer node's max_message_bytes fails the step at once, naming the "
          "edge, the destination and the limit",
          "[activation]") {
  auto opts = embedded_cluster::defaults();
  opts.max_message_bytes = 1 << 20;
  embedded_under_test c{{{"local", 2}}, opts};
  session_options so = c.defaults;
  so.timeout = 30s;
  session s = c.connect("local", 0, so);
  const int64_t floats = 512 * 1024; // 2 MiB, over the 1 MiB limit
  auto x = s.placeholder("x");
  output y, z;
  {
    auto d = value_of(s.device("/job:local/task:0"));
    // a scalar fed, a 2 MiB value made on task 0: nothing large goes through CAF first
    y = s.add(x, s.constant(tensor::filled(dtype::float32, {floats}, 0)), "widen");
  }
  {
    auto d = value_of(s.device("/job:local/task:1"));
    z = s.reduce_sum(y);
  }
  auto began = std::chrono::steady_clock::now();
  auto r = s.run({z}, {{x, tensor::scalar(1)}});
  auto took = std::chrono::steady_clock::now() - began;
  REQUIRE_FALSE(r);
  auto text = describe(r.error());
  INFO(text);
  CHECK(is(r.error(), af_error::resource_exhausted));
  CHECK(text.find("'widen'") != std::string::npos);
  CHECK(text.find("/job:local/replica:0/task:1/device:CPU:0") != std::string::npos);
  CHECK(text.find("max_message_bytes") != std::string::npos);
  CHECK(took < 10s); // not the 30 s step timeout
}

// Catches: a producer whose send to a dead node hangs until the step timeout
// (or forever), and an error that does not name the node that died.
TEST_CASE("a consumer node killed with SIGKILL mid-step fails the step promptly, naming it",
          "[activation][faults]") {
  processes_under_test c{{{"local", 2}}};
  session_options so = c.defaults;
  so.timeout = 60s;
  session s = c.connect("local", 0, so);
  const int64_t floats = 4 * 1024 * 1024; // 16 MiB a step
  two_node_graph g{s, floats};
  auto in = tensor::filled(dtype::float32, {floats}, 1);
  std::atomic<int> steps{0};
  caf::error failure;
  std::atomic<int64_t> failed_at{0};
  std::thread runner{[&] {
    for (;;) {
      auto r = s.run({g.z}, {{g.x, in}});
      if (!r) {
        failure = r.error();
        failed_at = std::chrono::steady_clock::now().time_since_epoch().count();
        return;
      }
      ++steps;
    }
  }};
  struct join_guard {
    std::thread& t;
    ~join_guard() {
      if (t.joinable())
        t.join();
    }
  } guard{runner};
  REQUIRE(eventually([&] { return steps.load() >= 2; }, 30s)); // waits for two steps to finish
  auto killed = std::chrono::steady_clock::now();
  REQUIRE(c.processes().signal("local", 1, SIGKILL));
  REQUIRE(eventually([&] { return failed_at.load() != 0; }, 20s)); // waits for a step to fail
  runner.join();
  auto took = std::chrono::steady_clock::time_point{std::chrono::steady_clock::duration{failed_at.load()}}
              - killed;
  auto text = describe(failure);
  INFO(text);
  CHECK(took < 10s); // not the 60 s step timeout
  CHECK((is(failure, af_error::peer_down) || is(failure, af_error::unreachable)));
  CHECK((text.find("task:1") != std::string::npos
         || text.find(c.address("local", 1)) != std::string::npos));
}

// Catches: an edge frame that crashes or hangs the node, one for an unknown
// executor acknowledged (or silently dropped) instead of refused, an
// oversize payload read before the refusal, and a stopped sender that keeps
// the node from serving others.
TEST_CASE("hostile edge frames are refused clearly and the node keeps serving", "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  std::string device = "/job:t/replica:0/task:0/device:CPU:0";
  auto exec = sys.spawn(executor_impl, device, std::shared_ptr<kernels::backend>{kernels::make_cpu_backend()},
                        std::shared_ptr<kernels::backend>{});
  auto dir = std::make_shared<variable_directory>();
  dir->put_executor(device, exec);
  data_plane_limits limits;
  limits.max_message_bytes = 1 << 20;
  limits.frame = 500ms;
  auto server = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "test node", limits));
  // A graph whose op waits for the value of op 7: an edge for it opens an inbox.
  partition part;
  part.graph = 5;
  part.step_timeout_ms = 60000;
  partition_op op;
  op.id = 8;
  op.op = "add";
  op.name = "waits";
  op_input in;
  in.kind = op_input::remote;
  in.op = 7;
  op.inputs = {in, in};
  part.ops.push_back(op);
  caf::scoped_actor self{sys};
  self->request(exec, 5s, register_atom::value, part)
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
  auto steps_held = [&] {
    uint64_t steps = 0;
    self->request(exec, 5s, info_atom::value)
      .receive([&](uint64_t, uint64_t n) { steps = n; }, [](caf::error& e) { FAIL(describe(e)); });
    return steps;
  };
  {
    int fd = raw_connect(server->port());
    // unknown device: refused before the payload, the connection goes on
    send_edge_head(fd, "/job:t/replica:0/task:0/device:GPU:9", 16);
    auto [st1, text1] = read_reply(fd);
    INFO(text1);
    CHECK(st1 == static_cast<uint8_t>(af_error::not_found));
    CHECK(text1.find("device:GPU:9") != std::string::npos);
    send_floats(fd, 16);
    // a name shorter than its prefix
    send_edge_head(fd, device, 16, 10);
    auto [st2, text2] = read_reply(fd);
    INFO(text2);
    CHECK(st2 == static_cast<uint8_t>(af_error::invalid_argument));
    CHECK(text2.find("prefix") != std::string::npos);
    send_floats(fd, 16);
    // 4 GiB declared, over the 1 MiB limit: answered at once, naming it
    send_edge_head(fd, device, uint64_t{1} << 30);
    auto [st3, text3] = read_reply(fd);
    INFO(text3);
    CHECK(st3 == static_cast<uint8_t>(af_error::resource_exhausted));
    CHECK(text3.find("max_message_bytes") != std::string::npos);
    close(fd);
  }
  {
    // a payload cut short: the sender goes silent, then away
    int fd = raw_connect(server->port());
    send_edge_head(fd, device, 1024);
    send_floats(fd, 10);
    close(fd);
  }
  CHECK(steps_held() == 0); // nothing above reached the executor
  // The node serves on: a well-formed value is taken and reaches the executor.
  auto ch = value_of(data_channel::connect("127.0.0.1", server->port(), "test node", 5s));
  auto err = ch->send_edge(device, 5, 77, 7, 0, tensor::filled(dtype::float32, {16}, 1));
  INFO(describe(err));
  CHECK_FALSE(err);
  CHECK(eventually([&] { return steps_held() == 1; })); // waits for the inbox of step 77
  // and an unknown device through the client says so, naming it
  auto unknown = ch->send_edge("/job:t/replica:0/task:3/device:CPU:0", 5, 78, 7, 0,
                               tensor::filled(dtype::float32, {16}, 1));
  REQUIRE(unknown);
  CHECK(is(unknown, af_error::not_found));
  CHECK(describe(unknown).find("task:3") != std::string::npos);
  server->stop();
  caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
}
