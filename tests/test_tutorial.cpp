// The tutorial's examples, each on an embedded cluster (nodes in this process)
// and across real actorflow-node processes on loopback.
#include "scenarios.hpp"

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
