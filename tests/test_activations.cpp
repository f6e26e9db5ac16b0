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
#include <future>
#include <thread>

#include <spdlog/sinks/ringbuffer_sink.h>

#include "certs.hpp"
#include "scenarios.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"
#include "net/data_plane.hpp"
#include "actors/variable_directory.hpp"
#include "actors/edge_token.hpp"
#include "actors/executor.hpp"
#include "core/log.hpp"
#include "net/tls.hpp"
#include "config/loopback.hpp"
#include "core/wire_format.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

bool shm_off() {
  const char* v = std::getenv("ACTORFLOW_DATA_SHM");
  return v != nullptr && std::string{v} == "off";
}

/// data-plane-tests-over-ucx forces UCX (and trusts the fabric): a channel
/// then moves to UCX after its first answer, TLS or not.
bool ucx_forced() {
  const char* v = std::getenv("ACTORFLOW_DATA_UCX");
  return v != nullptr && std::string{v} == "force";
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
  CHECK(note.find(ucx_forced() ? "by data plane (ucx"
                   : shm_off()  ? "by data plane (tcp) from "
                                : "by data plane (shared memory) from ")
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
    // Over UCX, TLS authenticates both ends first; from the second value on
    // the channel is on UCX.
    CHECK(e->note.find(ucx_forced() && step > 1 ? "by data plane (ucx" : "by data plane (tls) from ")
          != std::string::npos);
  }
}

// Catches: values between executors of one node sent through a socket (or a
// CAF message) instead of handed over as a shared buffer; and with the data
// plane off, edges that stop flowing instead of going as CAF messages.
TEST_CASE("a value between partitions on one node stays a local buffer, with the data plane off, "
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
    // That no copy is made on the way is checked below, executor to executor.
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

// Catches: a value between executors of one process that is copied on its
// way (serialized, or cloned into a new buffer) while the trace still says
// "local buffer": the consumer must get the very buffer the producer made.
// The consumer here records what its edge brings; the producer also fetches
// the value, so both ends are seen.
TEST_CASE("a value between executors of one process reaches the consumer as the producer's own "
          "buffer, not a copy",
          "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto exec = sys.spawn(executor_impl, std::string{"/job:t/replica:0/task:0/device:CPU:0"},
                        std::shared_ptr<kernels::backend>{kernels::make_cpu_backend()},
                        std::shared_ptr<kernels::backend>{});
  struct arrival {
    tensor value;
    std::string path;
  };
  auto edge = std::make_shared<std::promise<arrival>>();
  auto arrived = edge->get_future();
  auto consumer = sys.spawn([edge]() -> caf::behavior {
    return {[edge](edge_atom, uint64_t, uint64_t, int32_t, tensor& value, int64_t,
                   std::string& path, const std::string&) {
      edge->set_value(arrival{value, path});
    }};
  });
  partition part;
  part.graph = 3;
  part.edge_token = make_edge_token();
  partition_op op;
  op.id = 1;
  op.op = "mul";
  op.name = "produce";
  op_input x;
  x.kind = op_input::feed;
  x.op = 0;
  op_input two;
  two.kind = op_input::constant;
  two.value = tensor::filled(dtype::float32, {1024}, 2);
  op.inputs = {x, two};
  op.consumers = {consumer};
  op.consumer_devices = {"/job:t/replica:0/task:0/device:CPU:1"};
  op.fetch = true;
  part.ops.push_back(op);
  self->request(exec, 5s, register_atom::value, part)
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
  step_result result;
  std::vector<feed> feeds{feed{0, tensor::filled(dtype::float32, {1024}, 3)}};
  self->request(exec, 10s, run_step_atom::value, uint64_t{3}, uint64_t{1}, feeds)
    .receive([&](step_result& r) { result = std::move(r); },
             [](caf::error& e) { FAIL(describe(e)); });
  REQUIRE(result.fetched.size() == 1);
  const auto& produced = result.fetched[0].value;
  REQUIRE(arrived.wait_for(10s) == std::future_status::ready);
  auto got = arrived.get();
  CHECK(got.path == "local buffer");
  CHECK(got.value.at(1023) == 6);
  // One buffer end to end: the producer's result, its edge and the fetch.
  CHECK(got.value.shares_buffer_with(produced));
  CHECK(got.value.bytes() == produced.bytes());
  caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(consumer, caf::exit_reason::user_shutdown);
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

// Catches: a run that hangs until the step timeout after a consumer node
// dies mid-step, and an error that does not name the node that died. (The
// step runner monitors every partition's executor, so this fails promptly
// even if the edge send itself hung: "an edge send to a node that stopped
// reading" below catches that.)
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
  part.edge_token = make_edge_token();
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
  auto err = ch->send_edge(device, 5, part.edge_token, 77, 7, 0,
                           tensor::filled(dtype::float32, {16}, 1));
  INFO(describe(err));
  CHECK_FALSE(err);
  CHECK(eventually([&] { return steps_held() == 1; })); // waits for the inbox of step 77
  // and an unknown device through the client says so, naming it
  auto unknown = ch->send_edge("/job:t/replica:0/task:3/device:CPU:0", 5, part.edge_token, 78, 7,
                               0, tensor::filled(dtype::float32, {16}, 1));
  REQUIRE(unknown);
  CHECK(is(unknown, af_error::not_found));
  CHECK(describe(unknown).find("task:3") != std::string::npos);
  server->stop();
  caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
}

namespace {

/// An executor of its own, and a partition (graph `id`) whose op 'produce'
/// adds two constants of `floats` and sends the sum to task 1's CPU on the
/// data plane at `plane`; `consumer` stands for that executor (monitored).
struct lone_producer {
  caf::actor_system& sys;
  executor_actor exec;
  caf::actor consumer;
  std::string consumer_device = "/job:t/replica:0/task:1/device:CPU:0";
  std::string consumer_task = "/job:t/task:1";

  explicit lone_producer(caf::actor_system& s) : sys(s) {
    exec = sys.spawn(executor_impl, std::string{"/job:t/replica:0/task:0/device:CPU:0"},
                     std::shared_ptr<kernels::backend>{kernels::make_cpu_backend()},
                     std::shared_ptr<kernels::backend>{});
    consumer = sys.spawn([]() -> caf::behavior { return {[](int32_t) {}}; });
  }
  ~lone_producer() {
    caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(consumer, caf::exit_reason::user_shutdown);
  }

  void add(caf::scoped_actor& self, uint64_t id, const std::string& plane, int64_t floats,
           uint32_t step_timeout_ms) {
    partition part;
    part.graph = id;
    part.step_timeout_ms = step_timeout_ms;
    part.edge_token = make_edge_token();
    part.peers = {consumer};
    part.peer_devices = {consumer_device};
    partition_op op;
    op.id = 1;
    op.op = "add";
    op.name = "produce";
    op_input c;
    c.kind = op_input::constant;
    c.value = tensor::filled(dtype::float32, {floats}, 1);
    op.inputs = {c, c};
    op.consumers = {consumer};
    op.consumer_devices = {consumer_device};
    op.consumer_tasks = {consumer_task};
    op.consumer_data_planes = {plane};
    part.ops.push_back(op);
    self->request(exec, 5s, register_atom::value, part)
      .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
  }

  /// Runs step 1 of graph `id`: none, or the error.
  caf::error run(caf::scoped_actor& self, uint64_t id, std::chrono::milliseconds wait = 30s) {
    caf::error out;
    self->request(exec, wait, run_step_atom::value, id, uint64_t{1}, std::vector<feed>{})
      .receive([](step_result&) {}, [&](caf::error& e) { out = std::move(e); });
    return out;
  }
};

} // namespace

// Catches: an edge sender kept for the executor's whole life per destination
// address (data ports are ephemeral: every restart of a consumer node left a
// thread per executor behind), and one kept after the death of the consumer
// it served.
TEST_CASE("an edge sender whose destination failed or whose consumer died is stopped, leaving no "
          "thread behind",
          "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto before = live_edge_senders();
  SECTION("four destinations where nothing listens (a node that restarted elsewhere)") {
    lone_producer p{sys};
    for (uint64_t id = 1; id <= 4; ++id) {
      auto plane = "127.0.0.1:" + std::to_string(free_loopback_port());
      p.add(self, id, plane, 4, 10000);
      auto err = p.run(self, id);
      REQUIRE(err);
      auto text = describe(err);
      INFO(text);
      CHECK(is(err, af_error::unreachable));
      CHECK(text.find("'produce'") != std::string::npos);
      CHECK(text.find(plane) != std::string::npos);
    }
    // waits for the senders of the failed sends to end
    CHECK(eventually([&] { return live_edge_senders() == before; }, 5s));
  }
  SECTION("a live destination whose consumer executor dies") {
    auto consumer_exec = sys.spawn(executor_impl, std::string{"/job:t/replica:0/task:1/device:CPU:0"},
                                   std::shared_ptr<kernels::backend>{kernels::make_cpu_backend()},
                                   std::shared_ptr<kernels::backend>{});
    auto dir = std::make_shared<variable_directory>();
    dir->put_executor("/job:t/replica:0/task:1/device:CPU:0", consumer_exec);
    auto server = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "test node", {}));
    lone_producer p{sys};
    p.add(self, 1, "127.0.0.1:" + std::to_string(server->port()), 4, 10000);
    auto err = p.run(self, 1);
    INFO(describe(err));
    REQUIRE_FALSE(err);
    CHECK(live_edge_senders() == before + 1); // it stays for the next value
    caf::anon_send_exit(p.consumer, caf::exit_reason::kill);
    // waits for the executor to see its peer die and stop the sender
    CHECK(eventually([&] { return live_edge_senders() == before; }, 5s));
    server->stop();
    caf::anon_send_exit(consumer_exec, caf::exit_reason::user_shutdown);
  }
}

// Catches: an edge send to a node that stopped reading (SIGSTOPped, or its
// network gone) that hangs the producer's step past its timeout, or fails it
// without naming the edge and the destination; and a sender blocked in such a
// send that outlives its executor until the step timeout (delaying the
// node's shutdown by as long).
TEST_CASE("an edge send to a node that stopped reading fails the step within its timeout, naming "
          "the edge and the destination, the executor's exit ends the blocked send",
          "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  // A node that stopped: its kernel takes the connection, nobody reads it.
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  REQUIRE(listen(lfd, 8) == 0);
  struct closer {
    int fd;
    ~closer() { close(fd); }
  } guard{lfd};
  auto plane = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  const int64_t floats = 16 * 1024 * 1024; // 64 MiB: more than the socket buffers hold
  auto before = live_edge_senders();
  SECTION("the step fails by its timeout") {
    lone_producer p{sys};
    p.add(self, 1, plane, floats, 1500);
    auto began = std::chrono::steady_clock::now();
    auto err = p.run(self, 1);
    auto took = std::chrono::steady_clock::now() - began;
    REQUIRE(err);
    auto text = describe(err);
    INFO(text);
    CHECK(is(err, af_error::timeout));
    CHECK(text.find("'produce'") != std::string::npos);
    CHECK(text.find(p.consumer_device) != std::string::npos);
    CHECK(text.find(plane) != std::string::npos);
    CHECK(took < 10s); // bounded by its 1.5 s timeout, not hanging
  }
  SECTION("the executor's exit ends the send at once") {
    auto p = std::make_unique<lone_producer>(sys);
    p->add(self, 1, plane, floats, 60000);
    self->send(p->exec, run_step_atom::value, uint64_t{1}, uint64_t{1}, std::vector<feed>{});
    pollfd pfd{lfd, POLLIN, 0};
    REQUIRE(poll(&pfd, 1, 10000) == 1); // waits for the sender's connection
    REQUIRE(eventually([&] { return live_edge_senders() == before + 1; }, 5s)); // and its sender
    p.reset(); // the executor exits
    // waits for the sender to end: not the 60 s step timeout
    CHECK(eventually([&] { return live_edge_senders() == before; }, 5s));
  }
}

// Catches: an edge sender that names its peer by address only, so that with
// TLS the node's certificate is checked for the host but not for the task:
// another member's certificate on the same host was accepted.
TEST_CASE("with [security] an edge sender checks that the node's certificate is the consumer's task's",
          "[activation][tls]") {
  temp_dir dir;
  auto config = dir / "cluster.toml";
  std::string cluster = "[cluster]\nlocal = [\"127.0.0.1:" + std::to_string(free_loopback_port())
                        + "\", \"127.0.0.1:" + std::to_string(free_loopback_port()) + "\"]\n";
  write_file(config, cluster);
  write_file(config, cluster + "\n" + make_certs(config));
  auto loaded = value_of(load_cluster_config(config));
  // The data plane of task 1, with task 1's certificate.
  auto node_tls = value_of(make_tls_context(value_of(security_for(loaded.security, "local-1")),
                                            "task 1"));
  system_config cfg{node_options{}, value_of(security_for(loaded.security, "client"))};
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::string device = "/job:local/replica:0/task:1/device:CPU:0";
  auto consumer_exec = sys.spawn(executor_impl, device,
                                 std::shared_ptr<kernels::backend>{kernels::make_cpu_backend()},
                                 std::shared_ptr<kernels::backend>{});
  auto directory = std::make_shared<variable_directory>();
  directory->put_executor(device, consumer_exec);
  auto server =
    value_of(data_plane_server::start(directory, "127.0.0.1", 0, "task 1", {}, node_tls));
  auto plane = "127.0.0.1:" + std::to_string(server->port());
  lone_producer p{sys};
  p.consumer_device = device;
  SECTION("the task that answers") {
    p.consumer_task = "/job:local/task:1";
    p.add(self, 1, plane, 4, 10000);
    auto err = p.run(self, 1);
    INFO(describe(err));
    CHECK_FALSE(err);
  }
  SECTION("another task's certificate on the same host") {
    p.consumer_task = "/job:local/task:0";
    p.add(self, 1, plane, 4, 10000);
    auto err = p.run(self, 1);
    REQUIRE(err);
    auto text = describe(err);
    INFO(text);
    CHECK(text.find("'produce'") != std::string::npos);
    CHECK(text.find("/job:local/task:1's, not /job:local/task:0's") != std::string::npos);
  }
  server->stop();
  caf::anon_send_exit(consumer_exec, caf::exit_reason::user_shutdown);
}

// ---- The receiving side of edges (issue 12, attack findings F5 and F8) ----

namespace {

/// The process's warning lines written while it lives.
struct warn_capture {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink =
    std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(512);
  warn_capture() { log::get()->sinks().push_back(sink); }
  ~warn_capture() {
    auto& sinks = log::get()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  }
  size_t count(const std::string& a) const {
    size_t n = 0;
    for (auto& line : sink->last_formatted())
      n += line.find(a) != std::string::npos ? 1 : 0;
    return n;
  }
};

/// An executor on a data plane of its own, holding graph 5: op 8 'sum' adds
/// the values of ops 7 and 6, both from another partition, and is fetched.
struct edge_consumer {
  caf::actor_system& sys;
  std::string device = "/job:t/replica:0/task:0/device:CPU:0";
  executor_actor exec;
  std::unique_ptr<data_plane_server> server;
  caf::scoped_actor self;
  std::unique_ptr<data_channel> ch;
  std::string token = make_edge_token(); ///< graph 5's

  edge_consumer(caf::actor_system& s, int64_t max_message_bytes = 1 << 20)
      : sys(s), self(s) {
    exec = sys.spawn(executor_impl, device,
                     std::shared_ptr<kernels::backend>{kernels::make_cpu_backend()},
                     std::shared_ptr<kernels::backend>{});
    auto dir = std::make_shared<variable_directory>();
    dir->put_executor(device, exec);
    data_plane_limits limits;
    limits.max_message_bytes = max_message_bytes;
    limits.frame = 500ms;
    server = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "test node", limits));
    partition part;
    part.graph = 5;
    part.step_timeout_ms = 60000;
    part.edge_token = token;
    partition_op op;
    op.id = 8;
    op.op = "add";
    op.name = "sum";
    op.fetch = true;
    op_input a, b;
    a.kind = b.kind = op_input::remote;
    a.op = 7;
    b.op = 6;
    op.inputs = {a, b};
    part.ops.push_back(op);
    self->request(exec, 5s, register_atom::value, part)
      .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
    ch = value_of(data_channel::connect("127.0.0.1", server->port(), "test node", 5s));
  }
  ~edge_consumer() {
    ch.reset();
    server->stop();
    caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
  }
  /// Sends op `op`'s value for `step` on the data plane: none, or the error.
  /// (Taken: the executor has the message before any later request of ours.)
  caf::error edge(uint64_t step, int32_t op, float v, int64_t floats = 4) {
    return edge_with(token, step, op, v, floats);
  }
  /// As edge(), with `with` as the graph's edge token.
  caf::error edge_with(const std::string& with, uint64_t step, int32_t op, float v,
                       int64_t floats = 4) {
    return ch->send_edge(device, 5, with, step, op, 0, tensor::filled(dtype::float32, {floats}, v));
  }
  uint64_t steps_held() {
    uint64_t steps = 0;
    self->request(exec, 5s, info_atom::value)
      .receive([&](uint64_t, uint64_t n) { steps = n; }, [](caf::error& e) { FAIL(describe(e)); });
    return steps;
  }
  /// Starts step `step`; its answer comes to `self`.
  void start(uint64_t step) {
    self->send(exec, run_step_atom::value, uint64_t{5}, step, std::vector<feed>{});
  }
  /// The answer to start(): the sum's first element, or the error's text.
  std::pair<float, std::string> answer() {
    std::pair<float, std::string> out{-1.f, "no answer within 10 s"};
    self->receive(
      [&](step_result& r) {
        REQUIRE(r.fetched.size() == 1);
        out = {reinterpret_cast<const float*>(r.fetched[0].value.bytes())[0], ""};
      },
      [&](caf::error& e) { out = {-1.f, describe(e)}; },
      caf::after(10s) >> [] {});
    return out;
  }
};

} // namespace

// Catches (F5): a second value for an op overwriting the first (a stranger's
// edge silently replaced the producer's: the step computed with it), an
// identical resend failing the step, and an edge for an op the partition
// does not consume opening a step.
TEST_CASE("an edge never replaces the first value of its op, a different second one fails the "
          "step, naming it, an op the partition does not consume is dropped",
          "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  edge_consumer c{sys};
  warn_capture logs;
  // a different second value: the step fails, naming the op, and does not compute 100 + 2
  c.start(3);
  CHECK_FALSE(c.edge(3, 7, 1));
  CHECK_FALSE(c.edge(3, 7, 100)); // acked: the sender learns nothing
  auto [v3, text3] = c.answer();
  INFO(text3);
  CHECK(v3 != 102.f);
  CHECK(text3.find("op 7 of step 3") != std::string::npos);
  CHECK(text3.find("came twice") != std::string::npos);
  CHECK(logs.count("refused a second value of op 7 for step 3") == 1);
  // an identical resend is dropped: the step computes with the one value
  c.start(4);
  CHECK_FALSE(c.edge(4, 7, 1));
  CHECK_FALSE(c.edge(4, 7, 1));
  CHECK_FALSE(c.edge(4, 6, 2));
  auto [v4, text4] = c.answer();
  INFO(text4);
  CHECK(v4 == 3.f);
  // an op no input of the partition comes from: no step opened, logged
  CHECK_FALSE(c.edge(9, 2, 100));
  CHECK(c.steps_held() == 0);
  CHECK(logs.count("no op of this partition takes op 2") == 1);
}

// Catches (issue 22): a member who learned a graph id (it travels in clear on
// a plaintext cluster) being first to fill an op's value: its edge frame
// took the op's place in the step, and the producer's value was then refused
// as a second one (or the step computed with the forged one).
TEST_CASE("an edge frame with the right graph id but a wrong token is refused, logged with the "
          "sender's address, and the producer's value is then taken",
          "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  edge_consumer c{sys};
  warn_capture logs;
  auto forged = c.token;
  forged[5] = static_cast<char>(forged[5] ^ 1); // one bit off
  c.start(3);
  CHECK_FALSE(c.edge_with(forged, 3, 7, 100)); // acked like any: the ack says nothing
  CHECK_FALSE(c.edge_with(std::string(edge_token_bytes, '\0'), 3, 6, 100));
  // and before its run_step: no inbox is opened for it
  CHECK_FALSE(c.edge_with(forged, 4, 7, 100));
  CHECK(c.steps_held() == 1); // step 3 only
  CHECK_FALSE(c.edge(3, 7, 1));
  CHECK_FALSE(c.edge(3, 6, 2));
  auto [v, text] = c.answer();
  INFO(text);
  CHECK(text.empty());
  CHECK(v == 3.f);
  CHECK(logs.count("): its edge token is wrong") == 1); // then counted, every 10 s
  CHECK(logs.count("of graph 5 (data plane (tcp) from 127.0.0.1:") == 1);
  CHECK(c.steps_held() == 0);
}

// Catches (F5): a stranger parking values in any number of future steps
// (100 x 8 MiB held 800 MB), and an edge for a step whose run_step came
// before (stale) opening it again.
TEST_CASE("early edges open at most 4 steps of a graph, none at or below its newest run_step",
          "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  edge_consumer c{sys};
  c.start(20);
  CHECK_FALSE(c.edge(20, 7, 1));
  CHECK_FALSE(c.edge(20, 6, 1));
  CHECK(c.answer().first == 2.f);
  CHECK(c.steps_held() == 0);
  CHECK_FALSE(c.edge(18, 7, 1)); // stale: run_step 20 came
  CHECK(c.steps_held() == 0);
  for (uint64_t step = 30; step < 40; ++step)
    CHECK_FALSE(c.edge(step, 7, 1));
  CHECK(c.steps_held() == max_early_steps_per_graph);
  // the steps held run as usual
  c.start(30);
  CHECK_FALSE(c.edge(30, 6, 5));
  CHECK(c.answer().first == 6.f);
}

// Catches (F8): edge values piling up for an executor without bound (20 x
// 64 MiB queued for a busy one took 2 GB): over 2 x max_message_bytes of
// values no running step took, the data plane refuses the next before it
// allocates, naming the budget; a step that starts gives its bytes back.
TEST_CASE("the bytes of edges an executor holds before their steps start are bounded by 2 x "
          "max_message_bytes",
          "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  edge_consumer c{sys, 1 << 20};
  int64_t floats = (768 << 10) / 4; // 768 KiB a value
  CHECK_FALSE(c.edge(1, 7, 1, floats));
  CHECK_FALSE(c.edge(2, 7, 1, floats));
  auto over = c.edge(3, 7, 1, floats); // 2.25 MiB held > 2 MiB
  INFO(describe(over));
  REQUIRE(over);
  CHECK(is(over, af_error::resource_exhausted));
  CHECK(describe(over).find("max_message_bytes") != std::string::npos);
  CHECK(c.steps_held() == 2);
  // step 1 starts: its value is the running step's, room for another
  c.start(1);
  CHECK_FALSE(c.edge(1, 6, 1, floats));
  CHECK(c.answer().first == 2.f);
  auto again = c.edge(3, 7, 1, floats);
  INFO(describe(again));
  CHECK_FALSE(again);
}

// Catches: an edge frame with no tensor (has_tensor = 0, no payload) taken
// as a value (the step then failed with "input 0 has no value"), and a log
// line per hostile frame (a stranger's flood of frames was a flood of lines).
TEST_CASE("an edge frame without a tensor is refused, naming it, refusals of one connection are "
          "logged once, then counted",
          "[activation]") {
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  edge_consumer c{sys};
  warn_capture logs;
  int fd = raw_connect(c.server->port());
  for (int i = 0; i < 20; ++i) {
    wire::edge_prefix pre;
    pre.graph = 5;
    pre.op = 7;
    std::string name(sizeof(pre), '\0');
    std::memcpy(name.data(), &pre, sizeof(pre));
    name += c.device;
    wire::header h;
    h.kind = static_cast<uint8_t>(wire::kind::edge);
    h.name_len = static_cast<uint32_t>(name.size());
    h.version = 40 + i;
    h.has_tensor = 0;
    REQUIRE(send(fd, &h, sizeof(h), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h)));
    REQUIRE(send(fd, name.data(), name.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(name.size()));
    auto [st, text] = read_reply(fd);
    INFO(text);
    REQUIRE(st == static_cast<uint8_t>(af_error::invalid_argument));
    CHECK(text.find("has_tensor") != std::string::npos);
  }
  close(fd);
  CHECK(c.steps_held() == 0);
  CHECK(logs.count("refused an edge") == 1);
}
