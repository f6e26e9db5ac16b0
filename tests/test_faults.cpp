// Faults across real processes: nodes and clients killed with SIGKILL or
// stopped with SIGSTOP, never only a polite SIGTERM.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <future>

#include "caf/all.hpp"

#include "actors/node.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "messages/error.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "wait.hpp"

using namespace std::chrono_literals;

namespace af::testing {

namespace {

/// x * x on worker 1, then + 1 on worker 0: a step whose partition on task 0
/// waits for a value from task 1. Returns (x, the result).
std::pair<output, output> two_node_step(session& s) {
  auto x = s.placeholder("x");
  output y, z;
  {
    auto d = value_of(s.device("/job:worker/task:1"));
    y = s.mul(x, x, "square_on_1");
  }
  {
    auto d = value_of(s.device("/job:worker/task:0"));
    z = s.add(y, s.constant(tensor::scalar(1.0f)), "plus_one_on_0");
  }
  return {x, z};
}

} // namespace

TEST_CASE("after a ps is killed every call fails at once saying it died, and the same session "
          "works again once it is back",
          "[faults][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 60s; // a call that waited for its timeout would say "timed out", not "died"
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0", so));
  output v;
  {
    auto d = value_of(s.device("/job:ps/task:0"));
    v = value_of(s.variable("v", {}));
  }
  auto inc = s.assign_add(v, s.constant(tensor::scalar(1.0f)));
  auto twice = s.add(v, v); // a graph step: registered with the ps's executor
  require_ok(s.initialize());
  CHECK(value_of(s.run(inc)).at(0) == 1);
  CHECK(value_of(s.run(twice)).at(0) == 2);

  REQUIRE(pc->signal("ps", 0, SIGKILL));
  // Each later call, through the data plane, a graph step or CAF, says the
  // node died; none waits for its 60 s timeout.
  for (int i = 0; i < 3; ++i) {
    auto r = s.run(i == 1 ? twice : inc);
    REQUIRE(!r);
    INFO(describe(r.error()));
    CHECK(is(r.error(), af_error::peer_down));
    CHECK(describe(r.error()).find("/job:ps/task:0") != std::string::npos);
  }
  auto listed = s.list_variables("ps", 0);
  REQUIRE(!listed);
  CHECK(is(listed.error(), af_error::peer_down));
  CHECK(describe(listed.error()).find("died") != std::string::npos);

  require_ok(pc->restart("ps", 0));
  // The restarted node holds no `v`: said as such, not as a stale handle.
  auto stale = s.run(v);
  REQUIRE(!stale);
  INFO(describe(stale.error()));
  CHECK(is(stale.error(), af_error::gone));
  CHECK(describe(stale.error()).find("'v'") != std::string::npos);
  CHECK(describe(stale.error()).find("restarted") != std::string::npos);
  // initialize() creates it again; the same session's graphs run again.
  require_ok(s.initialize());
  CHECK(value_of(s.run(inc)).at(0) == 1);
  CHECK(value_of(s.run(twice)).at(0) == 2);
}

TEST_CASE("a node killed while a step waits on it fails the step at once with its name, and the "
          "other node drops the step",
          "[faults][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"worker", 2}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 60s;
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0", so));
  auto [x_node, z_node] = two_node_step(s);
  output x = x_node, z = z_node;
  auto feed = tensor::scalar(3.0f);
  CHECK(value_of(s.run({z}, {{x, feed}})).at(0).at(0) == 10);

  // Task 1 stops: task 0's partition waits for y, which cannot come.
  REQUIRE(pc->signal("worker", 1, SIGSTOP));
  auto step = std::async(std::launch::async, [&] { return s.run({z}, {{x, feed}}); });
  auto probe = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0"));
  REQUIRE(eventually([&] {
    auto load = probe.executor_load("worker", 0);
    return load && load->second == 1; // the step is open on task 0, waiting
  }));
  REQUIRE(pc->signal("worker", 1, SIGKILL));
  REQUIRE(step.wait_for(30s) == std::future_status::ready);
  auto r = step.get();
  REQUIRE(!r);
  INFO(describe(r.error()));
  CHECK(is(r.error(), af_error::peer_down));
  CHECK(describe(r.error()).find("/job:worker/task:1") != std::string::npos);
  // Task 0's executor let go of the step (it watched its peer die).
  CHECK(eventually([&] {
    auto load = probe.executor_load("worker", 0);
    return load && load->second == 0;
  }));
}

TEST_CASE("a stopped node is seen through missed heartbeats, and works again after SIGCONT",
          "[faults][processes]") {
  node_options opts;
  opts.heartbeat_ms = 100;
  opts.connection_timeout_ms = 1000;
  auto pc = value_of(process_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 60s;
  so.connect_timeout = 2s;
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0", so));
  output v;
  {
    auto d = value_of(s.device("/job:ps/task:0"));
    v = value_of(s.variable("v", {}, initializer::constant(4)));
  }
  auto twice = s.add(v, v);
  require_ok(s.initialize());
  CHECK(value_of(s.run(twice)).at(0) == 8);
  REQUIRE(pc->signal("ps", 0, SIGSTOP));
  // The step cannot finish; the heartbeat, not the 60 s timeout, ends it.
  auto r = s.run(twice);
  REQUIRE(!r);
  INFO(describe(r.error()));
  CHECK(is(r.error(), af_error::peer_down));
  CHECK(describe(r.error()).find("/job:ps/task:0") != std::string::npos);
  REQUIRE(pc->signal("ps", 0, SIGCONT));
  // Same process, same incarnation: the session finds everything again.
  require_ok(s.wait_for_node("ps", 0, 20s));
  CHECK(value_of(s.run(twice)).at(0) == 8);
}

TEST_CASE("executors forget the graphs of a client that was killed", "[faults][processes]") {
  node_options opts;
  opts.heartbeat_ms = 100;
  opts.connection_timeout_ms = 1000;
  auto pc = value_of(process_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  cluster_client c{opts};
  auto probe = value_of(session::make(*c.sys, pc->spec(), "/job:ps/task:0"));
  auto before = value_of(probe.executor_load("worker", 0)).first;
  background_process victim{{ACTORFLOW_TEST_CLIENT_BINARY, pc->config_path()}};
  REQUIRE(victim.wait_for("registered", 30s));
  INFO(victim.output());
  CHECK(victim.output().find("value [6. 6.]") != std::string::npos);
  CHECK(value_of(probe.executor_load("worker", 0)).first == before + 1);
  victim.signal(SIGKILL);
  CHECK(eventually([&] { return value_of(probe.executor_load("worker", 0)).first == before; }));
}

TEST_CASE("each node's clock offset is measured within half a round trip", "[faults][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"worker", 2}}, opts));
  cluster_client c{opts};
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0"));
  for (int t = 0; t < 2; ++t) {
    auto clk = value_of(s.clock_of("worker", t));
    INFO("offset " << clk.offset_ns << " ns, rtt " << clk.rtt_ns << " ns");
    CHECK(clk.rtt_ns > 0);
    // One machine, one steady clock: the true offset is 0, so the estimate
    // must lie within its own error bound.
    CHECK(std::abs(clk.offset_ns) <= clk.rtt_ns / 2 + 1000);
  }
}

namespace {

/// A node clock 7.25 s ahead of this process's steady clock (node_clock).
constexpr int64_t injected_offset_ns = 7'250'000'000;

int64_t clock_ahead() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
           .count()
         + injected_offset_ns;
}

} // namespace

// Catches: an estimate that is not measured (a constant 0 passes the test
// above, where the true offset is 0) or measured with the wrong sign or
// midpoint. The node's clock is handed to start_node: no config or
// environment can set it.
TEST_CASE("a node clock with a known offset is measured at that offset, within half a round trip",
          "[faults]") {
  node_options opts;
  opts.threads = 2;
  system_config node_cfg{opts};
  caf::actor_system node_sys{node_cfg};
  auto node = start_node(node_sys, "worker", 0, "127.0.0.1", 0, opts, {}, {}, clock_ahead);
  REQUIRE(node);
  auto spec = cluster_spec::from_jobs({{"worker", {node->address}}});
  REQUIRE(spec);
  {
    cluster_client c{opts};
    auto s = value_of(session::make(*c.sys, *spec, "/job:worker/task:0"));
    auto clk = value_of(s.clock_of("worker", 0));
    INFO("offset " << clk.offset_ns << " ns, rtt " << clk.rtt_ns << " ns");
    CHECK(clk.rtt_ns > 0);
    CHECK(std::abs(clk.offset_ns - injected_offset_ns) <= clk.rtt_ns / 2 + 1000);
  }
  node->data_plane->stop();
  caf::anon_send_exit(node->actor, caf::exit_reason::user_shutdown);
}

TEST_CASE("restarting a peer node twice leaves one graph on the node that stayed up",
          "[faults][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"worker", 2}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 20s;
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0", so));
  auto [x_node, z_node] = two_node_step(s);
  output x = x_node, z = z_node;
  auto feed = tensor::scalar(3.0f);
  CHECK(value_of(s.run({z}, {{x, feed}})).at(0).at(0) == 10);
  auto before = value_of(s.executor_load("worker", 0)).first;
  for (int round = 0; round < 2; ++round) {
    REQUIRE(pc->signal("worker", 1, SIGKILL));
    CHECK(!s.run({z}, {{x, feed}}));
    require_ok(pc->restart("worker", 1));
    require_ok(s.wait_for_node("worker", 1, 20s));
    CHECK(value_of(s.run({z}, {{x, feed}})).at(0).at(0) == 10);
  }
  // The steps bound to the dead executors were dropped on the surviving node too.
  CHECK(eventually([&] { return value_of(s.executor_load("worker", 0)).first == before; }));
}

TEST_CASE("a step that only reads a variable of a restarted ps runs again once it is initialized",
          "[faults][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 20s;
  so.data_plane = GENERATE(true, false);
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0", so));
  output v;
  {
    auto d = value_of(s.device("/job:ps/task:0"));
    v = value_of(s.variable("v", {}, initializer::constant(2)));
  }
  auto twice = s.add(v, v); // runs on the worker: the ps only holds v
  require_ok(s.initialize());
  CHECK(value_of(s.run(twice)).at(0) == 4);
  REQUIRE(pc->signal("ps", 0, SIGKILL));
  require_ok(pc->restart("ps", 0));
  require_ok(s.wait_for_node("ps", 0, 20s));
  require_ok(s.initialize());
  CHECK(value_of(s.run(twice)).at(0) == 4);
}

TEST_CASE("a session that found a variable gone sees it again once the chief re-creates it",
          "[faults][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"ps", 1}, {"worker", 2}}, opts));
  cluster_client c{opts};
  auto chief = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0"));
  auto other = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:1"));
  output vc, vo;
  {
    auto d = value_of(chief.device("/job:ps/task:0"));
    vc = value_of(chief.variable("v", {}, initializer::constant(2)));
  }
  {
    auto d = value_of(other.device("/job:ps/task:0"));
    vo = value_of(other.variable("v", {}, initializer::constant(2)));
  }
  require_ok(chief.initialize());
  CHECK(value_of(other.run(vo)).at(0) == 2);
  REQUIRE(pc->signal("ps", 0, SIGKILL));
  require_ok(pc->restart("ps", 0));
  require_ok(other.wait_for_node("ps", 0, 20s));
  auto early = other.run(vo);
  REQUIRE(!early);
  CHECK(is(early.error(), af_error::gone));
  require_ok(chief.wait_for_node("ps", 0, 20s));
  require_ok(chief.initialize());
  require_ok(other.wait_initialized(5s));
  CHECK(value_of(other.run(vo)).at(0) == 2);
  (void) vc;
}

} // namespace af::testing
