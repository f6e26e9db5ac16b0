// The tutorial's examples, each on an embedded cluster (nodes in this process)
// and across real actorflow-node processes on loopback.
#include <algorithm>
#include <optional>

#include "scenarios.hpp"

using namespace af;
using namespace af::testing;

#define CLUSTERS embedded_under_test, processes_under_test

TEMPLATE_TEST_CASE("w+b and w*b placed on /gpu:0 give 7s and 10s and the trace shows where they ran",
                   "[tutorial]", CLUSTERS) {
  TestType c{{{"local", 2}}};
  single_device_example(c);
}

TEMPLATE_TEST_CASE("two clients on the two servers of one job share var by name", "[tutorial]",
                   CLUSTERS) {
  TestType c{{{"local", 2}}};
  shared_variable_example(c);
}

TEMPLATE_TEST_CASE("var1 on task 0 and var2 on task 1 show up on their own tasks", "[tutorial]",
                   CLUSTERS) {
  TestType c{{{"local", 2}}};
  placement_example(c);
}

TEMPLATE_TEST_CASE("two independent clients creating var on one task get the same variable",
                   "[tutorial]", CLUSTERS) {
  TestType c{{{"local", 2}}};
  same_variable_example(c);
}

TEMPLATE_TEST_CASE("a client waits for another to initialize var and a short wait names what is missing",
                   "[tutorial]", CLUSTERS) {
  TestType c{{{"local", 2}}};
  wait_for_initialization_example(c);
}

TEMPLATE_TEST_CASE("two workers incrementing a ps variable five times each leave it at 10",
                   "[tutorial]", CLUSTERS) {
  TestType c{{{"ps", 1}, {"worker", 2}}};
  ps_and_two_workers_example(c);
}

TEMPLATE_TEST_CASE("bad input gets typed errors that name the thing", "[errors]", CLUSTERS) {
  TestType c{{{"local", 2}}};
  bad_input_example(c);
}

TEST_CASE("a tensor assigned to and read from a variable on the same node is never copied",
          "[embedded][zero-copy]") {
  auto ec = value_of(embedded_cluster::start({{"local", 1}}));
  auto& sys = ec->system("local", 0);
  {
    auto s = value_of(ec->session_for("local", 0));
    auto v = value_of(s.variable("big", {1 << 20}));
    auto handle = s.handle_of(v);
    auto value = tensor::filled(dtype::float32, {1 << 20}, 2);
    caf::scoped_actor self{sys, true};
    tensor read_back;
    self->request(handle, 10s, var_op_atom::value, var_op::assign, value, false)
      .receive([](tensor&, uint64_t) {}, [](caf::error& e) { FAIL(describe(e)); });
    self->request(handle, 10s, var_op_atom::value, var_op::read, tensor{}, false)
      .receive([&](tensor& t, uint64_t) { read_back = t; }, [](caf::error& e) { FAIL(describe(e)); });
    CHECK(read_back.shares_buffer_with(value));
    CHECK(read_back.bytes() == value.bytes());
    // The executor of that node computes on the variable's own buffer: sum_to
    // of a value onto its own shape is that value (no kernel runs), so the
    // step hands back the very buffer the executor got from the variable. A
    // copy on the way (a serialized read, a defensive clone) shows as another
    // address.
    auto same = value_of(s.run(s.op("sum_to", {v, v}, {}, "as_is")));
    CHECK(same.bytes() == value.bytes());
    CHECK(same.shares_buffer_with(value));
    // and an op that computes writes its own buffer, never the variable's
    auto doubled = value_of(s.run(s.add(v, v)));
    CHECK(doubled.at(0) == 4);
    CHECK(doubled.bytes() != value.bytes());
    CHECK(value.at(0) == 2);
  }
}

TEMPLATE_TEST_CASE("four clients incrementing one ps variable 100 times each lose no update",
                   "[data-plane]", CLUSTERS) {
  TestType c{{{"ps", 1}, {"worker", 1}}};
  concurrent_increments_example(c, 4, 100);
}

TEST_CASE("with the data plane off, variable ops go as CAF messages and behave the same",
          "[processes][basp]") {
  processes_under_test c{{{"ps", 1}, {"worker", 2}}};
  c.defaults.data_plane = false;
  // Every session of the examples counts what it sent, and which way, here.
  // A session that opened the data plane anyway (its results would be the
  // same) shows as calls over it.
  auto calls = std::make_shared<variable_call_counter>();
  c.defaults.variable_calls = calls;
  ps_and_two_workers_example(c);
  concurrent_increments_example(c, 2, 20);
  CHECK(calls->data_plane.load() == 0);
  // At least the 10 increments of the first and the 40 of the second.
  CHECK(calls->actor_messages.load() >= 50);
  auto s = c.connect("ps", 0);
  CHECK(value_of(s.data_transport("ps", 0)).rfind("CAF messages", 0) == 0);
}

TEST_CASE("with the data plane off, bad input still gets typed errors", "[processes][basp][errors]") {
  processes_under_test c{{{"local", 2}}};
  c.defaults.data_plane = false;
  bad_input_example(c);
}

TEST_CASE("ps-workers run twice against the same node processes ends at 10 both times",
          "[tutorial][processes]") {
  processes_under_test c{{{"ps", 1}, {"worker", 2}}};
  for (int run = 1; run <= 2; ++run) {
    INFO("run " << run << " of the library's example");
    auto r = value_of(tutorial::ps_workers(c.sessions()));
    CHECK(r.final_value == 10);
    CHECK(all_increments(r) == one_to(10));
    CHECK(std::is_sorted(r.ps_saw.begin(), r.ps_saw.end())); // no read went back in time
  }
  // The program, as a user runs it against nodes that already hold var (= 10).
  for (int run = 1; run <= 2; ++run) {
    INFO("run " << run << " of actorflow-tutorial ps-workers --config");
    auto out = run_command({ACTORFLOW_TUTORIAL_BINARY, "ps-workers", "--config",
                            c.processes().config_path(), "--pause-ms", "0"},
                           60s);
    INFO(out.output);
    CHECK(out.exit_code == 0);
    CHECK(out.output.find("Final value of var on /job:ps/task:0: 10.") != std::string::npos);
  }
}

TEST_CASE("workers wait for the ps's own run: a value an earlier run left is not incremented",
          "[tutorial][processes]") {
  processes_under_test c{{{"ps", 1}, {"worker", 2}}};
  // An earlier run left var at 7 on the ps.
  auto earlier = c.connect("ps", 0);
  output var;
  {
    auto d = value_of(earlier.device("/job:ps/task:0"));
    var = value_of(earlier.variable("var", {}));
  }
  value_of(earlier.run(earlier.assign(var, earlier.constant(scalar(7)))));
  // Before the ps initializes, both workers must be parked on var, waiting for
  // this run, with var untouched. (Workers that waited for any value would
  // take the 7 and increment it: the two waiters never show up, var moves.)
  tutorial::ps_workers_params params;
  params.wait_timeout = 20s;
  std::optional<variable_info> parked;
  double value_when_parked = -1;
  params.before_initialize = [&](const std::string&) -> caf::error {
    // On the ps's thread: no Catch2 assertions here, only what happened.
    auto info = tutorial::wait_for_waiters(earlier, "ps", 0, "var", 2, 10s);
    if (!info)
      return std::move(info.error());
    parked = *info;
    auto v = earlier.run(var);
    if (!v)
      return std::move(v.error());
    value_when_parked = v->at(0);
    return caf::none;
  };
  auto r = value_of(tutorial::ps_workers(c.sessions(), params));
  REQUIRE(parked);
  CHECK(parked->waiters == 2);
  CHECK(parked->version == 1); // the earlier assign, and no update since
  CHECK(parked->run_id != r.run_id);
  CHECK(value_when_parked == 7);
  CHECK(r.final_value == 10);
  CHECK(all_increments(r) == one_to(10));
}
