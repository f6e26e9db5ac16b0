// The tutorial's multi-device data parallelism and model parallelism
// (tutorial/tutorial.hpp), on an embedded cluster and across node processes,
// and what the traces of such steps say.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "scenarios.hpp"

using namespace af;
using namespace af::testing;

namespace {

void require_close(const tensor& a, const tensor& b, double tol = 1e-5) {
  REQUIRE(a.shape() == b.shape());
  for (size_t i = 0; i < a.num_elements(); ++i) {
    INFO("element " << i << ": " << a.at(i) << " vs " << b.at(i));
    CHECK(std::abs(a.at(i) - b.at(i)) <= tol + tol * std::abs(b.at(i)));
  }
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// The raw spans of a step the client ran from `began` to `ended` (its steady
/// clock, which the trace uses): each op that ran took time, and every span
/// lies within the step, give or take `slack`, how far a time taken on a node
/// may be misplaced (half the round trip its clock offset was measured over).
void check_spans(const run_trace& trace, int64_t began, int64_t ended, int64_t slack) {
  REQUIRE_FALSE(trace.entries.empty());
  for (const auto& e : trace.entries) {
    INFO(e.op << " (" << e.kind << ") on " << e.device << ": " << e.start_ns - began << " .. "
              << e.end_ns - began << " ns into a step of " << ended - began << " ns, slack " << slack);
    if (e.op.find(" -> ") != std::string::npos)
      CHECK(e.start_ns <= e.end_ns + 2 * slack); // sent on one node's clock, received on another's
    else
      CHECK(e.start_ns < e.end_ns); // it ran (or was read), which takes time
    CHECK(e.start_ns >= began - slack);
    CHECK(e.end_ns <= ended + slack);
  }
}

node_options two_cpus() {
  auto opts = embedded_cluster::defaults();
  opts.cpu_devices = 2;
  return opts;
}

} // namespace

#define CLUSTERS embedded_under_test, processes_under_test

TEMPLATE_TEST_CASE("two towers on cpu:0 and cpu:1 averaging their gradients equal one device on the whole batch",
                   "[compute][tutorial]", CLUSTERS) {
  TestType c{{{"local", 1}}, two_cpus()};
  tutorial::towers_params params;
  params.steps = 30;
  tutorial::towers_result r = value_of(tutorial::towers(c.sessions(), "local", params));
  // The towers' averaged gradients are the whole batch's (a tower that got
  // the wrong half, a sum not halved, a gradient of the wrong input differ).
  require_close(r.averaged_grad_w, r.whole_grad_w);
  require_close(r.averaged_grad_b, r.whole_grad_b);
  // the towers really ran on two devices
  CHECK(r.tower_devices == std::vector<std::string>{"/job:local/replica:0/task:0/device:CPU:0",
                                                    "/job:local/replica:0/task:0/device:CPU:1"});
  // the update applies the averaged gradient, times the learning rate
  REQUIRE(r.w_after_first.num_elements() == 4);
  for (size_t i = 0; i < 4; ++i)
    CHECK(r.w_after_first.at(i)
          == Approx(r.w_before.at(i) - params.learning_rate * r.averaged_grad_w.at(i)).epsilon(1e-5));
  // and training works: the loss fell, by a lot on this learnable target
  REQUIRE(r.losses.size() == 30);
  CHECK(r.losses.back() < 0.5 * r.losses.front());
  // the step's spans: ops took time, and every span lies within the step
  check_spans(r.first_step, r.first_step_began_ns, r.first_step_ended_ns, r.clock_slack_ns);
}

TEMPLATE_TEST_CASE("a two-layer network split over two nodes trains like the same network on one",
                   "[compute][model-parallel]", CLUSTERS) {
  TestType c{{{"local", 2}}};
  tutorial::model_parallel_params params;
  params.steps = 20;
  tutorial::model_parallel_result r =
    value_of(tutorial::model_parallel(c.sessions(), "local", params));
  // Before training, from the same weights: the same loss and gradients.
  CHECK(r.loss.at(0) == Approx(r.one_node_loss.at(0)).epsilon(1e-5));
  require_close(r.grad_w1, r.one_node_grad_w1);
  require_close(r.grad_w2, r.one_node_grad_w2);
  // and the same losses at every step: the updates applied across nodes are
  // the ones applied on one
  REQUIRE(r.losses.size() == r.one_node_losses.size());
  for (size_t i = 0; i < r.losses.size(); ++i) {
    INFO("step " << i);
    CHECK(r.losses[i] == Approx(r.one_node_losses[i]).epsilon(1e-4));
  }
  CHECK(r.losses.back() < r.losses.front());
  const auto& trace = r.first_step;
  auto layer1 = trace.find("layer1"), layer2 = trace.find("layer2");
  REQUIRE(layer1 != nullptr);
  REQUIRE(layer2 != nullptr);
  CHECK(layer1->node == c.address("local", 0));
  CHECK(layer2->node == c.address("local", 1));
  // layer 1's inputs were x and w1, its result the size of the activations
  CHECK(layer1->bytes_in == r.x.nbytes() + r.w1_initial.nbytes());
  CHECK(layer1->bytes_out == r.hidden.nbytes());
  // The activations crossed from task 0 to task 1 (and their gradients
  // back), executor to executor; each variable was read on its own node.
  bool forward_edge = false, backward_edge = false;
  for (const auto& e : trace.entries) {
    if (e.kind != "transfer")
      continue;
    CHECK(e.op != "w1");
    CHECK(e.op != "w2");
    if (e.op == "relu -> layer2") {
      forward_edge = true;
      CHECK(e.bytes_in == r.hidden.nbytes()); // the relu'd activations that arrived
      CHECK(e.node == c.address("local", 1));
      CHECK(e.note.rfind("from /job:local/replica:0/task:0/device:CPU:0 @ " + c.address("local", 0)
                           + " by data plane (",
                         0)
            == 0); // on task 1's data plane, not a CAF message
    }
    if (e.node == c.address("local", 0)
        && e.note.rfind("from /job:local/replica:0/task:1/device:CPU:0 @ " + c.address("local", 1)
                          + " by data plane (",
                        0)
             == 0)
      backward_edge = true;
  }
  CHECK(forward_edge);
  CHECK(backward_edge);
  check_spans(trace, r.first_step_began_ns, r.first_step_ended_ns, r.clock_slack_ns);
  // the trace exports as Chrome trace events: a span per entry, a process per node
  auto json = nlohmann::json::parse(trace.to_chrome_json());
  size_t spans = 0;
  std::set<int> pids;
  for (const auto& ev : json["traceEvents"])
    if (ev["ph"] == "X") {
      ++spans;
      pids.insert(ev["pid"].get<int>());
      CHECK(ev["args"].contains("bytes_in"));
    }
  CHECK(spans == trace.entries.size());
  CHECK(pids.size() == 2); // two nodes
}

TEMPLATE_TEST_CASE("a variable used by an op on another node shows as a transfer span on the path it took",
                   "[compute][trace]", CLUSTERS) {
  bool data_plane = GENERATE(true, false);
  INFO("data plane: " << data_plane);
  TestType c{{{"local", 2}}};
  c.defaults.data_plane = data_plane;
  session s = c.connect("local", 0);
  output v;
  {
    auto d = value_of(s.device("/job:local/task:1"));
    v = value_of(s.variable("far", {3}, initializer::ones(), dtype::float64));
  }
  require_ok(s.initialize());
  tensor held = value_of(s.run(v)); // what the variable holds, read by the client
  auto d = value_of(s.device("/job:local/task:0"));
  run_trace trace;
  auto began = steady_ns();
  tensor y = value_of(s.run(s.add(v, v, "near_add"), &trace));
  auto ended = steady_ns();
  CHECK(y.values<double>() == std::vector<double>{2, 2, 2});
  auto e = trace.find("far");
  REQUIRE(e != nullptr);
  INFO("note: " << e->note);
  CHECK(e->kind == "transfer");
  CHECK(e->node == c.address("local", 1));
  CHECK(e->note.find("to /job:local/replica:0/task:0/device:CPU:0 @ " + c.address("local", 0))
        != std::string::npos);
  if (data_plane) {
    node_info info = value_of(s.ping("local", 1));
    REQUIRE(info.data_port != 0);
    auto plane = task_address{c.spec().address("local", 1)->host, info.data_port};
    // the transport it took (tcp, or shared memory after a channel's first answer)
    CHECK(e->note.find("by data plane (") != std::string::npos);
    CHECK(e->note.find(") from " + plane.to_string()) != std::string::npos);
  } else {
    CHECK(e->note.find("by CAF message from " + c.address("local", 1)) != std::string::npos);
  }
  // the bytes that arrived: the variable's float64 value, not a float32 guess
  CHECK(e->bytes_in == held.nbytes());
  CHECK(e->start_ns < e->end_ns);
  int64_t slack = 0;
  for (int32_t t : {0, 1})
    slack = std::max(slack, value_of(s.clock_of("local", t)).rtt_ns / 2 + 1);
  check_spans(trace, began, ended, slack);
  auto json = nlohmann::json::parse(trace.to_chrome_json());
  bool found = false;
  for (const auto& ev : json["traceEvents"])
    found |= ev["ph"] == "X" && ev["cat"] == "transfer" && ev["name"] == "far";
  CHECK(found);
}

TEMPLATE_TEST_CASE("a step's partitions are registered once and then only run", "[compute][partitions]",
                   CLUSTERS) {
  TestType c{{{"local", 2}}};
  auto s = c.connect("local", 0);
  auto x = s.placeholder("x");
  output y, z;
  {
    auto d = value_of(s.device("/job:local/task:1"));
    y = s.op("square", {x}, {}, "on_task1");
  }
  z = s.add(y, s.constant(tensor::scalar(1)), "on_task0");
  for (float v : {1.f, 2.f, 3.f}) {
    auto got = value_of(s.run({z}, {{x, tensor::scalar(v)}}));
    CHECK(got[0].at(0) == v * v + 1);
  }
  CHECK(s.registered_graphs() == 1);
  value_of(s.run({y, z}, {{x, tensor::scalar(2)}}));
  CHECK(s.registered_graphs() == 2);
  // a placeholder nobody fed, and a feed that is not a placeholder
  auto missing = s.run({z});
  REQUIRE_FALSE(missing);
  CHECK(describe(missing.error()).find("placeholder 'x' needs a value") != std::string::npos);
  auto not_ph = s.run({z}, {{y, tensor::scalar(1)}});
  REQUIRE_FALSE(not_ph);
  CHECK(describe(not_ph.error()).find("not a placeholder") != std::string::npos);
}

TEMPLATE_TEST_CASE("a partition that fails stops the whole step with its own error, not a timeout",
                   "[compute][partitions][errors]", CLUSTERS) {
  TestType c{{{"local", 2}}};
  session_options opts = c.defaults;
  opts.timeout = std::chrono::seconds(20);
  session s = c.connect("local", 0, opts);
  auto a = s.placeholder("a"), b = s.placeholder("b");
  output bad;
  {
    auto d = value_of(s.device("/job:local/task:1"));
    bad = s.add(a, b, "mismatched"); // [2] + [3] fails on task 1
  }
  auto after = s.mul(bad, s.constant(tensor::scalar(2)), "waits_on_task0");
  auto start = std::chrono::steady_clock::now();
  auto r = s.run({after}, {{a, tensor::filled(dtype::float32, {2}, 1)}, {b, tensor::filled(dtype::float32, {3}, 1)}});
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::shape_mismatch));
  CHECK(describe(r.error()).find("'mismatched'") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  // the next step with good feeds works
  auto ok = value_of(s.run({after}, {{a, tensor::filled(dtype::float32, {2}, 1)},
                                     {b, tensor::filled(dtype::float32, {2}, 2)}}));
  CHECK(ok[0].values<float>() == std::vector<float>{6, 6});
}
