// The tutorial's examples, each on an embedded cluster (nodes in this process)
// and across real actorflow-node processes on loopback.
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
    // and the executor of that node computes on the variable's own buffer
    auto doubled = value_of(s.run(s.add(v, v)));
    CHECK(doubled.at(0) == 4);
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
  ps_and_two_workers_example(c);
  concurrent_increments_example(c, 2, 20);
}

TEST_CASE("with the data plane off, bad input still gets typed errors", "[processes][basp][errors]") {
  processes_under_test c{{{"local", 2}}};
  c.defaults.data_plane = false;
  bad_input_example(c);
}
