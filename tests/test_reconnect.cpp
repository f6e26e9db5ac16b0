// A session finds a restarted node by itself: a ps SIGKILLed and started
// again on its address (a new process) is re-resolved on the session's next
// call, its graph partitions registered with the new executors, its data
// channel opened again, and the session says so once.
// (tests/test_faults.cpp has the calls failing while it is down and the
// variables coming back through initialize(); this adds what the session
// does without being told: no wait_for_node, one note, the same paths.)
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "caf/all.hpp"

#include "actors/session.hpp"
#include "actors/system.hpp"
#include "messages/error.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "wait.hpp"

using namespace std::chrono_literals;

namespace af::testing {

namespace {

std::string path_of(const run_trace& trace, const std::string& kind) {
  for (const auto& e : trace.entries)
    if (e.kind == kind)
      return e.note;
  return "(no " + kind + " in the trace)";
}

} // namespace

// Bugs caught: a session that needs wait_for_node (or a new session) after a
// restart; one that says it reconnected on every call, or never; one that
// falls back to CAF messages because it never reopened the data channel;
// one that keeps running its step on the dead executors.
TEST_CASE("a session reconnects to a restarted ps by itself, re-registers its step there and "
          "says so once",
          "[reconnect][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 20s;
  recovery_notes notes;
  so.on_recovery = notes.hook();
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0", so));
  output v, twice;
  {
    auto d = value_of(s.device("/job:ps/task:0"));
    v = value_of(s.variable("v", {}, initializer::constant(2)));
    twice = s.add(v, v, "twice_on_ps"); // a partition on the ps's executor
  }
  auto inc = s.assign_add(v, s.constant(tensor::scalar(1.0f)));
  require_ok(s.initialize());
  CHECK(value_of(s.run(twice)).at(0) == 4);
  CHECK(value_of(s.executor_load("ps", 0)).first == 1);

  REQUIRE(pc->signal("ps", 0, SIGKILL));
  require_ok(pc->restart("ps", 0));
  const auto address = value_of(pc->spec().address("ps", 0)).to_string();
  // No wait_for_node: the next call finds the new process. Its `v` is gone
  // (a new process holds no variables) until someone creates it again.
  // The session may see the death only when this call's first attempt fails,
  // so this first call may fail either way, but not with a stale handle.
  bool reconnected = eventually([&] {
    auto r = s.run(twice);
    if (r)
      return false; // cannot happen: the new node has no `v`
    INFO(describe(r.error()));
    CHECK((is(r.error(), af_error::gone) || is(r.error(), af_error::peer_down)));
    return is(r.error(), af_error::gone);
  }, 20s);
  INFO(notes.all());
  REQUIRE(reconnected);
  CHECK(notes.count("reconnected to /job:ps/task:0 at " + address + " (restarted)") == 1);

  require_ok(s.initialize());
  run_trace trace;
  CHECK(value_of(s.run(std::vector<output>{twice}, &trace)).at(0).at(0) == 4);
  // The step's partition is registered with the new node's executor.
  CHECK(value_of(s.executor_load("ps", 0)).first == 1);
  trace.entries.clear();
  CHECK(value_of(s.run(std::vector<output>{inc}, &trace)).at(0).at(0) == 3);
  // The update went over the reopened data channel, not a CAF fallback.
  CHECK(path_of(trace, "assign_add").find("data plane") != std::string::npos);
  for (int i = 0; i < 3; ++i)
    value_of(s.run(twice));
  // Said once, not once per call.
  CHECK(notes.count("reconnected to") == 1);
}

} // namespace af::testing
