// A node's /metrics and /healthz (metrics/node_metrics.hpp, docs/watching.md):
// scraped over plain HTTP on loopback, the counters checked against the
// traffic the test makes (variable ops over tcp, shm and caf, steps of a
// graph, a sync training job's rounds and pushes), /healthz's 200 and 503s,
// and the refusals of a bad [node] metrics_port or metrics_bind.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "caf/all.hpp"

#include "actors/session.hpp"
#include "actors/variable_directory.hpp"
#include "config/cluster_spec.hpp"
#include "config/loopback.hpp"
#include "dist/embedded_cluster.hpp"
#include "dist/training.hpp"
#include "log_capture.hpp"
#include "messages/error.hpp"
#include "messages/executor.hpp"
#include "metrics/node_metrics.hpp"
#include "metrics/thread_stack.hpp"
#include "value_of.hpp"
#include "wait.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

struct http_answer {
  int status = 0;
  std::string body;
};

/// Sends `request` to 127.0.0.1:`port` and reads until the server closes.
std::string raw_request(uint16_t port, const std::string& request) {
  int fd = connect_loopback(port);
  REQUIRE(fd >= 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL)
          == static_cast<ssize_t>(request.size()));
  std::string raw;
  char buf[4096];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
      break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return raw;
}

/// GET `path` from 127.0.0.1:`port` with a plain socket (HTTP/1.0: the
/// server closes after its answer).
http_answer http_get(uint16_t port, const std::string& path) {
  auto raw = raw_request(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  http_answer out;
  INFO("the answer: " << raw);
  REQUIRE(raw.rfind("HTTP/1.", 0) == 0);
  out.status = std::stoi(raw.substr(raw.find(' ') + 1, 3));
  auto end = raw.find("\r\n\r\n");
  REQUIRE(end != std::string::npos);
  out.body = raw.substr(end + 4);
  return out;
}

/// The value of `series` (`name{labels}` as the text format writes it) in
/// a /metrics body; nullopt if it is not there.
std::optional<double> sample(const std::string& body, const std::string& series) {
  std::istringstream lines{body};
  std::string line;
  while (std::getline(lines, line))
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0
        && line[series.size()] == ' ')
      return std::stod(line.substr(series.size() + 1));
  return std::nullopt;
}

/// The value of `series` in a scrape of /metrics on `port`; fails if absent.
double scrape(uint16_t port, const std::string& series) {
  auto r = http_get(port, "/metrics");
  REQUIRE(r.status == 200);
  auto v = sample(r.body, series);
  INFO(series << " in:\n" << r.body);
  REQUIRE(v);
  return *v;
}

/// [node] options with /metrics on a free loopback port.
node_options with_metrics(node_options opts = embedded_cluster::defaults()) {
  opts.metrics_port = free_loopback_port();
  return opts;
}

/// Sets ACTORFLOW_DATA_SHM for the scope, then puts it back.
struct shm_environment {
  std::optional<std::string> before;
  explicit shm_environment(const char* value) {
    if (const char* v = std::getenv("ACTORFLOW_DATA_SHM"))
      before = v;
    ::setenv("ACTORFLOW_DATA_SHM", value, 1);
  }
  ~shm_environment() {
    if (before)
      ::setenv("ACTORFLOW_DATA_SHM", before->c_str(), 1);
    else
      ::unsetenv("ACTORFLOW_DATA_SHM");
  }
};

std::string ops_of(const std::string& transport) {
  return "actorflow_variable_ops_total{transport=\"" + transport + "\"}";
}

std::string bytes_of(const std::string& direction, const std::string& transport) {
  return "actorflow_transport_bytes_total{direction=\"" + direction + "\",transport=\"" + transport
         + "\"}";
}

} // namespace

TEST_CASE("a node's /metrics counts variable ops and bytes by transport: tcp and shm on the data "
          "plane, caf through the variable's actor",
          "[metrics]") {
  // Bugs it catches: a transport's counter that never moves or moves for
  // another's (the frame counted before the connection moved to shared
  // memory, or as tcp after), an op counted twice (request and reply),
  // replies' bytes not counted, CAF's ops not counted, and a /metrics that
  // does not serve the text format at all.
  auto opts = with_metrics();
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  auto& sys = cluster->system("ps", 0);
  auto metrics = value_of(start_node_metrics(sys, cluster->node("ps", 0), "/job:ps/task:0", opts));
  REQUIRE(metrics->port() == opts.metrics_port);
  const int64_t floats = 1000;
  const int n = 7;
  for (std::string transport : {"tcp", "shm"}) {
    CAPTURE(transport);
    shm_environment env{transport == "tcp" ? "off" : "on"};
    auto s = value_of(cluster->session_for("worker", 0));
    output v;
    {
      auto d = value_of(s.device("/job:ps/task:0"));
      v = value_of(s.variable("v_" + transport, {floats}, initializer::zeros()));
    }
    auto inc = s.assign_add(v, s.constant(tensor{dtype::float32, {floats}}));
    REQUIRE(!s.initialize());
    value_of(s.run(v)); // the channel's first op (then an offer moves it to shm)
    value_of(s.run(v));
    REQUIRE(value_of(s.data_transport("ps", 0)) == (transport == "tcp" ? "tcp" : "shared memory"));
    auto ops0 = scrape(metrics->port(), ops_of(transport));
    auto in0 = scrape(metrics->port(), bytes_of("received", transport));
    auto out0 = scrape(metrics->port(), bytes_of("sent", transport));
    for (int i = 0; i < n; ++i)
      REQUIRE(!s.run_targets({inc}));
    for (int i = 0; i < n; ++i)
      value_of(s.run(v));
    CHECK(scrape(metrics->port(), ops_of(transport)) - ops0 == 2 * n);
    // Each assign_add carried its operand; each read's reply the value.
    CHECK(scrape(metrics->port(), bytes_of("received", transport)) - in0 >= n * floats * 4.0);
    CHECK(scrape(metrics->port(), bytes_of("sent", transport)) - out0 >= n * floats * 4.0);
  }
  // The chief's own node: its session reaches the variable's actor by CAF.
  auto s = value_of(cluster->session_for("ps", 0));
  output v;
  {
    auto d = value_of(s.device("/job:ps/task:0"));
    v = value_of(s.variable("v_caf", {floats}, initializer::zeros()));
  }
  auto inc = s.assign_add(v, s.constant(tensor{dtype::float32, {floats}}));
  REQUIRE(!s.initialize());
  auto ops0 = scrape(metrics->port(), ops_of("caf"));
  auto in0 = scrape(metrics->port(), bytes_of("received", "caf"));
  for (int i = 0; i < n; ++i)
    REQUIRE(!s.run_targets({inc}));
  CHECK(scrape(metrics->port(), ops_of("caf")) - ops0 == n);
  CHECK(scrape(metrics->port(), bytes_of("received", "caf")) - in0 == n * floats * 4.0);
  // The process's own figures are there too.
  CHECK(scrape(metrics->port(), "actorflow_process_threads") > 1);
  CHECK(scrape(metrics->port(), "actorflow_process_resident_memory_bytes") > 1 << 20);
}

TEST_CASE("a node's /metrics has a step latency histogram per executor that counts each step of "
          "a graph, and its live graphs",
          "[metrics]") {
  // Bugs it catches: steps not observed (or observed twice: at run_step and
  // at the reply), a histogram whose buckets do not add up to its count,
  // and executors missing from the scrape.
  auto opts = with_metrics();
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  auto metrics = value_of(start_node_metrics(cluster->system("ps", 0), cluster->node("ps", 0),
                                             "/job:ps/task:0", opts));
  auto s = value_of(cluster->session_for("worker", 0));
  output y;
  {
    auto d = value_of(s.device("/job:ps/task:0"));
    auto v = value_of(s.variable("w", {4}, initializer::ones()));
    y = s.op("mul", {v, s.constant(tensor::scalar(2.0f))});
  }
  REQUIRE(!s.initialize());
  value_of(s.run(y));
  const std::string exec = "/job:ps/replica:0/task:0/device:CPU:0";
  const std::string count = "actorflow_step_latency_seconds_count{executor=\"" + exec + "\"}";
  auto before = scrape(metrics->port(), count);
  const int n = 5;
  for (int i = 0; i < n; ++i)
    value_of(s.run(y));
  CHECK(scrape(metrics->port(), count) - before == n);
  auto body = http_get(metrics->port(), "/metrics").body;
  INFO(body);
  auto inf = sample(body, "actorflow_step_latency_seconds_bucket{executor=\"" + exec
                            + "\",le=\"+Inf\"}");
  REQUIRE(inf);
  CHECK(*inf == *sample(body, count));
  CHECK(*sample(body, "actorflow_step_latency_seconds_sum{executor=\"" + exec + "\"}") > 0);
  CHECK(*sample(body, "actorflow_graphs{executor=\"" + exec + "\"}") >= 1);
}

TEST_CASE("a sync training job moves a node's aggregator rounds and per-worker pushes by what "
          "its chief reports",
          "[metrics]") {
  // Bugs it catches: aggregators missing from the scrape, rounds or pushes
  // read from the wrong figure, workers' labels swapped or missing.
  auto opts = with_metrics();
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}, {"worker", 2}}, opts));
  auto metrics = value_of(start_node_metrics(cluster->system("ps", 0), cluster->node("ps", 0),
                                             "/job:ps/task:0", opts));
  train::train_config c;
  c.mode = "sync";
  c.steps = 20;
  c.log_every = 0;
  c.eval_every = 0;
  c.step_timeout_ms = 20000;
  train_options topts;
  topts.shutdown_ps = false;
  topts.print = false;
  std::vector<caf::expected<train_outcome>> results(2, make_error(af_error::internal, "not run"));
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      auto s = cluster->session_for("worker", static_cast<int32_t>(w));
      results[w] = s ? run_worker_task(*s, c, w, topts) : caf::expected<train_outcome>{s.error()};
    });
  for (auto& t : threads)
    t.join();
  for (auto& r : results)
    REQUIRE(r);
  const auto& stats = results[0]->stats;
  REQUIRE(stats.applied >= c.steps);
  auto body = http_get(metrics->port(), "/metrics").body;
  INFO(body);
  // One aggregator on ps 0: find its name from its line.
  auto at = body.find("actorflow_aggregator_rounds_total{aggregator=\"");
  REQUIRE(at != std::string::npos);
  auto name_at = at + std::string{"actorflow_aggregator_rounds_total{aggregator=\""}.size();
  auto name = body.substr(name_at, body.find('"', name_at) - name_at);
  CHECK(*sample(body, "actorflow_aggregator_rounds_total{aggregator=\"" + name + "\"}")
        == stats.applied);
  REQUIRE(stats.workers.size() == 2);
  for (const auto& w : stats.workers) {
    auto l = "{aggregator=\"" + name + "\",worker=\"" + std::to_string(w.worker) + "\"}";
    CHECK(sample(body, "actorflow_aggregator_pushes_total" + l) == std::optional<double>{w.pushes});
    CHECK(sample(body, "actorflow_aggregator_late_pushes_total" + l) == std::optional<double>{w.late});
    CHECK(sample(body, "actorflow_aggregator_refused_pushes_total" + l)
          == std::optional<double>{w.refused});
    CHECK(w.pushes > 0);
  }
}

TEST_CASE("/healthz answers 200 ok while the node serves, 503 naming the limit while the data "
          "plane refuses connections, and 503 while it shuts down or after it stopped",
          "[metrics]") {
  // Bugs it catches: a health check that always says ok, one that does not
  // recover when the limit frees, and one that still says ok for a node
  // that is gone.
  auto opts = with_metrics();
  opts.max_data_connections = 1;
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}}, opts));
  auto node = cluster->node("ps", 0);
  auto metrics = value_of(start_node_metrics(cluster->system("ps", 0), node, "/job:ps/task:0", opts));
  auto ok = http_get(metrics->port(), "/healthz");
  CHECK(ok.status == 200);
  CHECK(ok.body == "ok\n");
  // civetweb's threads get room for the process's TLS: this process's
  // pthread_attr_setstacksize is metrics/thread_stack.cpp's.
  CHECK(metrics_thread_stack_active());
  // Another path, another method, a request that is not HTTP: refused, and
  // the node serves on (civetweb's error path once overflowed its thread's
  // stack and killed the node: metrics/thread_stack.hpp).
  CHECK(http_get(metrics->port(), "/nothing").status == 404);
  CHECK(raw_request(metrics->port(), "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
          .rfind("HTTP/1.0 404", 0)
        == 0);
  raw_request(metrics->port(), "GARBAGE\r\n\r\n");
  CHECK(http_get(metrics->port(), "/healthz").status == 200);
  // HEAD: the status and headers alone (a body would be read by a client
  // that keeps the connection as its next answer); a method that would
  // change something is not answered as if it were a probe.
  auto head = raw_request(metrics->port(), "HEAD /healthz HTTP/1.0\r\n\r\n");
  CHECK(head.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(head.size() >= 4);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");
  auto post = raw_request(metrics->port(), "POST /healthz HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
  CHECK(post.rfind("HTTP/1.1 405", 0) == 0);
  CHECK(post.find("Allow: GET, HEAD\r\n") != std::string::npos);
  // One connection is all it serves: the next would be refused.
  int fd = connect_loopback(node.data_plane->port());
  REQUIRE(fd >= 0);
  http_answer full;
  CHECK(eventually([&] {
    full = http_get(metrics->port(), "/healthz");
    return full.status == 503;
  }));
  CHECK(full.body.find("max_data_connections = 1") != std::string::npos);
  ::close(fd);
  CHECK(eventually([&] { return http_get(metrics->port(), "/healthz").status == 200; }));
  // Told that it shuts down (a program's signal handler does this).
  metrics->shutting_down("signal 15");
  auto stopping = http_get(metrics->port(), "/healthz");
  CHECK(stopping.status == 503);
  CHECK(stopping.body == "shutting down: signal 15\n");

  // A node that stopped by itself says so.
  auto opts2 = with_metrics();
  auto cluster2 = value_of(embedded_cluster::start({{"ps", 1}}, opts2));
  auto node2 = cluster2->node("ps", 0);
  auto metrics2 = value_of(start_node_metrics(cluster2->system("ps", 0), node2, "/job:ps/task:0",
                                              opts2));
  REQUIRE(http_get(metrics2->port(), "/healthz").status == 200);
  caf::anon_send_exit(node2.actor, caf::exit_reason::user_shutdown);
  http_answer gone;
  CHECK(eventually([&] {
    gone = http_get(metrics2->port(), "/healthz");
    return gone.status == 503;
  }));
  CHECK(gone.body.find("shutting down: the node stopped") == 0);
}

TEST_CASE("a bad [node] metrics_port or metrics_bind is refused with an error that names the "
          "option",
          "[metrics]") {
  // Bugs it catches: a port out of range taken (or wrapped to another), a
  // port in use that fails silently (no /metrics, no error), and plain HTTP
  // opened on every interface without [security] saying so.
  auto bad = parse_cluster_toml("[cluster]\nps = [\"127.0.0.1:1\"]\n[node]\nmetrics_port = 70000\n",
                                "bad.toml");
  REQUIRE(!bad);
  CHECK(describe(bad.error()).find("node.metrics_port = 70000 is out of range [0, 65535]")
        != std::string::npos);
  auto bad_bind = parse_cluster_toml("[cluster]\nps = [\"127.0.0.1:1\"]\n[node]\nmetrics_bind = \"\"\n",
                                     "bad.toml");
  REQUIRE(!bad_bind);
  CHECK(describe(bad_bind.error()).find("node.metrics_bind must be an address") != std::string::npos);
  auto good = value_of(parse_cluster_toml("[cluster]\nps = [\"127.0.0.1:1\"]\n[node]\nmetrics_port "
                                          "= 9400\n[security]\nmetrics_public = true\n",
                                          "good.toml"));
  CHECK(good.node.metrics_port == 9400);
  CHECK(good.node.metrics_bind == "127.0.0.1");
  CHECK(good.security.metrics_public);

  auto opts = embedded_cluster::defaults();
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}}, opts));
  auto& sys = cluster->system("ps", 0);
  auto node = cluster->node("ps", 0);
  opts.metrics_port = 70000;
  auto out_of_range = start_node_metrics(sys, node, "/job:ps/task:0", opts);
  REQUIRE(!out_of_range);
  CHECK(describe(out_of_range.error()).find("[node] metrics_port = 70000") != std::string::npos);

  uint16_t taken = 0;
  int holder = listen_on_loopback(taken);
  REQUIRE(holder >= 0);
  opts.metrics_port = taken;
  auto in_use = start_node_metrics(sys, node, "/job:ps/task:0", opts);
  ::close(holder);
  REQUIRE(!in_use);
  CHECK(is(in_use.error(), af_error::bind_failed));
  CHECK(describe(in_use.error()).find("metrics_port = " + std::to_string(taken))
        != std::string::npos);

  opts.metrics_port = free_loopback_port();
  opts.metrics_bind = "0.0.0.0";
  auto open_to_all = start_node_metrics(sys, node, "/job:ps/task:0", opts);
  REQUIRE(!open_to_all);
  CHECK(describe(open_to_all.error()).find("[node] metrics_bind = \"0.0.0.0\"") != std::string::npos);
  CHECK(describe(open_to_all.error()).find("[security] metrics_public = true") != std::string::npos);
}

TEST_CASE("idle connections to the metrics port hold its threads only for the request timeout, "
          "and /healthz answers a probe behind them",
          "[metrics]") {
  // Bug it catches: civetweb's defaults (a thread per connection, 30 s for
  // a request to come) let two connections that send nothing keep /healthz
  // from answering for 30 s, and a probe behind them failed; a client that
  // keeps doing so kept the node "unhealthy". The probe here waits 10 s
  // (raw_request's receive timeout): twice the request timeout.
  auto opts = with_metrics();
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}}, opts));
  auto node = cluster->node("ps", 0);
  auto metrics = value_of(start_node_metrics(cluster->system("ps", 0), node, "/job:ps/task:0", opts));
  std::vector<int> idle;
  for (int k = 0; k < metrics_server_threads; ++k) {
    int fd = connect_loopback(metrics->port());
    REQUIRE(fd >= 0);
    std::string partial = "GET /metrics HTTP/1.1\r\n"; // and never the rest
    REQUIRE(::send(fd, partial.data(), partial.size(), MSG_NOSIGNAL) > 0);
    idle.push_back(fd);
  }
  auto probe = http_get(metrics->port(), "/healthz");
  CHECK(probe.status == 200);
  for (int fd : idle)
    ::close(fd);
}

TEST_CASE("[node] metrics_bind takes any IPv4 spelling of an address, and an IPv6 one only where "
          "civetweb serves IPv6",
          "[metrics]") {
  // Bugs it catches: "127.1" (loopback, allowed) passed the check but civetweb
  // could not parse it and the node stopped with "is another process using
  // the port?"; "::1" on Debian's civetweb (no IPv6) failed the same way
  // instead of saying why.
  auto opts = embedded_cluster::defaults();
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}}, opts));
  auto& sys = cluster->system("ps", 0);
  auto node = cluster->node("ps", 0);
  opts.metrics_port = free_loopback_port();
  opts.metrics_bind = "127.1";
  {
    auto short_form = value_of(start_node_metrics(sys, node, "/job:ps/task:0", opts));
    CHECK(http_get(short_form->port(), "/healthz").status == 200);
  }
  opts.metrics_bind = "::1";
  auto v6 = check_metrics_options(opts, {}, "/job:ps/task:0");
  if (metrics_serve_ipv6()) {
    CHECK(!v6);
  } else {
    REQUIRE(v6);
    CHECK(describe(v6).find("serves IPv4 only") != std::string::npos);
    CHECK(describe(v6).find("metrics_bind = \"::1\"") != std::string::npos);
  }
}

TEST_CASE("[node] metrics_bind with a port or in brackets is refused as no host, not as a public "
          "address",
          "[metrics]") {
  // Bug it catches: "127.0.0.1:80" and "[::1]" were refused as "not a
  // loopback address", which sends a user to [security] metrics_public
  // for what is a misspelt host (the port belongs in metrics_port).
  auto opts = embedded_cluster::defaults();
  opts.metrics_port = 9100;
  for (const char* host : {"127.0.0.1:80", "[::1]", "localhost:9100", ""}) {
    INFO(host);
    opts.metrics_bind = host;
    auto err = check_metrics_options(opts, {}, "/job:ps/task:0");
    REQUIRE(err);
    CHECK(describe(err).find("is not a host name or address") != std::string::npos);
    CHECK(describe(err).find("metrics_public") == std::string::npos);
  }
  opts.metrics_bind = "127.0.0.1";
  CHECK_FALSE(check_metrics_options(opts, {}, "/job:ps/task:0"));
}

TEST_CASE("a scrape waits for the node's actors at most its budget, all of them together, and "
          "names the parts that did not answer",
          "[metrics]") {
  // Bugs it catches: each request of a scrape waiting its own
  // request_timeout_ms one after the other (two stuck executors held the
  // scrape, and a civetweb thread, for 2 x 30 s here: past the 10 s this
  // test's client waits), one deadline spent by the first stuck part so
  // that the parts after it, which answer, are left out too, and a scrape
  // that drops a part without saying so.
  auto opts = with_metrics();
  opts.request_timeout_ms = 30000; // what one request alone may wait
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}}, opts));
  auto& sys = cluster->system("ps", 0);
  auto node = cluster->node("ps", 0);
  auto metrics = value_of(start_node_metrics(sys, node, "/job:ps/task:0", opts));
  // Two executors stuck in a handler (as one whose step never ends), each
  // on a thread of its own.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto stuck_executor = [&] {
    auto a = sys.spawn<caf::detached>([released](caf::event_based_actor*) -> caf::behavior {
      return {[released](info_atom) -> caf::result<uint64_t, uint64_t> {
        released.wait();
        return {uint64_t{0}, uint64_t{0}};
      }};
    });
    return caf::actor_cast<executor_actor>(a);
  };
  const std::string stuck_a = "/job:ps/replica:0/task:0/device:AAA:0";
  const std::string stuck_b = "/job:ps/replica:0/task:0/device:BBB:0";
  const std::string real = "/job:ps/replica:0/task:0/device:CPU:0";
  auto a = stuck_executor();
  auto b = stuck_executor();
  node.directory->put_executor(stuck_a, a);
  node.directory->put_executor(stuck_b, b);
  af::test::log_capture log;
  for (int scrape_n = 0; scrape_n < 2; ++scrape_n) {
    CAPTURE(scrape_n);
    auto t0 = std::chrono::steady_clock::now();
    auto r = http_get(metrics->port(), "/metrics");
    auto took = std::chrono::steady_clock::now() - t0;
    INFO(r.body);
    REQUIRE(r.status == 200);
    // The budget and the node's own work, far from one request's 30 s.
    CHECK(took < std::chrono::milliseconds{metrics_scrape_budget_ms + 4000});
    CHECK(sample(r.body, "actorflow_scrape_incomplete") == std::optional<double>{2});
    CHECK(sample(r.body, "actorflow_scrape_skipped{part=\"executor " + stuck_a + "\"}")
          == std::optional<double>{1});
    CHECK(sample(r.body, "actorflow_scrape_skipped{part=\"executor " + stuck_b + "\"}")
          == std::optional<double>{1});
    // The parts that answer are there, the node's variables among them:
    // asked after every executor, their answer is awaited after the stuck ones'.
    CHECK(sample(r.body, "actorflow_graphs{executor=\"" + real + "\"}"));
    CHECK(sample(r.body, "actorflow_parked_waiters"));
    CHECK(!sample(r.body, "actorflow_graphs{executor=\"" + stuck_a + "\"}"));
  }
  // Said once, naming both, while the same parts hang.
  int said = 0;
  for (const auto& line : log.sink->last_formatted())
    if (line.find("did not answer within the scrape's budget") != std::string::npos) {
      said += 1;
      CHECK(line.find("executor " + stuck_a + ", executor " + stuck_b) != std::string::npos);
    }
  CHECK(said == 1);
  release.set_value();
  node.directory->remove_executor(stuck_a);
  node.directory->remove_executor(stuck_b);
  auto again = http_get(metrics->port(), "/metrics");
  CHECK(sample(again.body, "actorflow_scrape_incomplete") == std::optional<double>{0});
  CHECK(log.has("every part of the node answers the scrape again", ""));
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
}

TEST_CASE("/metrics served beyond loopback is warned about with its address and port, on "
          "loopback it is not",
          "[metrics]") {
  // Bug it catches: [security] metrics_public = true opened plain HTTP to
  // whoever reaches the port and the log said only where it listens. (The
  // warning of a real non-loopback bind is not logged here: the tests serve
  // on loopback only; start_node_metrics logs this sentence as it is.)
  node_options opts;
  opts.metrics_port = 9400;
  opts.metrics_bind = "0.0.0.0";
  security_options sec;
  sec.metrics_public = true;
  auto open = metrics_exposure_warning(opts, sec, "/job:ps/task:0");
  INFO(open);
  CHECK(open.find("/job:ps/task:0: /metrics and /healthz listen on 0.0.0.0 port 9400") == 0);
  CHECK(open.find("metrics_public = true") != std::string::npos);
  CHECK(open.find("anyone who can reach that port") != std::string::npos);
  CHECK(open.find("without authentication") != std::string::npos);
  sec.metrics_public = false;
  sec.insecure = true;
  CHECK(metrics_exposure_warning(opts, sec, "n").find("insecure = true") != std::string::npos);
  // On loopback, metrics_public or not: nothing to warn about, and nothing said.
  sec.metrics_public = true;
  auto local = with_metrics();
  CHECK(metrics_exposure_warning(local, sec, "n").empty());
  auto cluster = value_of(embedded_cluster::start({{"ps", 1}}, local));
  af::test::log_capture log;
  auto metrics = value_of(start_node_metrics(cluster->system("ps", 0), cluster->node("ps", 0),
                                             "/job:ps/task:0", local, sec));
  CHECK(log.has("/metrics and /healthz on http://127.0.0.1", ""));
  CHECK(!log.has("without authentication", ""));
}
