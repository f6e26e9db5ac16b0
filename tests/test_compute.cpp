// The tutorial's multi-device data parallelism and model parallelism, on an
// embedded cluster and across node processes.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "scenarios.hpp"

using namespace af;
using namespace af::testing;

namespace {

tensor random32(shape_type shape, uint64_t seed) {
  tensor t{dtype::float32, std::move(shape)};
  REQUIRE(kernels::fill_uniform(t, -1, 1, seed).ok());
  return t;
}

/// Rows [from, to) of a 2-D tensor.
tensor rows(const tensor& t, int64_t from, int64_t to) {
  auto cols = t.shape()[1];
  auto all = t.values<float>();
  std::vector<float> v(all.begin() + from * cols, all.begin() + to * cols);
  return tensor::from_values<float>({to - from, cols}, v);
}

void require_close(const tensor& a, const tensor& b, double tol = 1e-5) {
  REQUIRE(a.shape() == b.shape());
  for (size_t i = 0; i < a.num_elements(); ++i) {
    INFO("element " << i << ": " << a.at(i) << " vs " << b.at(i));
    CHECK(std::abs(a.at(i) - b.at(i)) <= tol + tol * std::abs(b.at(i)));
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
  auto s = c.connect("local", 0);
  auto x = random32({8, 4}, 1), t = random32({8, 1}, 2);
  output w, b;
  {
    auto cpu = value_of(s.device("/cpu:0"));
    w = value_of(s.variable("w", {4, 1}, initializer::from_tensor(random32({4, 1}, 3))));
    b = value_of(s.variable("b", {1}, initializer::constant(0.5)));
  }
  require_ok(s.initialize());
  auto model_loss = [&](output xs, output ts) {
    auto pred = s.add(s.matmul(xs, w), b);
    return s.reduce_mean(s.square(s.sub(pred, ts)));
  };
  // the towers: half a batch each, on their own device
  std::vector<std::vector<output>> tower_grads;
  for (int i = 0; i < 2; ++i) {
    auto dev = value_of(s.device("/cpu:" + std::to_string(i)));
    auto loss = model_loss(s.constant(rows(x, 4 * i, 4 * i + 4)), s.constant(rows(t, 4 * i, 4 * i + 4)));
    tower_grads.push_back(value_of(s.gradients(loss, {w, b})));
  }
  // averaged and applied on the CPU that holds the variables
  auto cpu0 = value_of(s.device("/cpu:0"));
  auto half = s.constant(tensor::scalar(0.5f));
  auto avg_w = s.mul(s.add(tower_grads[0][0], tower_grads[1][0]), half, "avg_w");
  auto avg_b = s.mul(s.add(tower_grads[0][1], tower_grads[1][1]), half, "avg_b");
  // the reference: one device, the whole batch
  auto whole = value_of(s.gradients(model_loss(s.constant(x), s.constant(t)), {w, b}));
  run_trace trace;
  auto got = value_of(s.run({avg_w, avg_b, whole[0], whole[1]}, &trace));
  require_close(got[0], got[2]);
  require_close(got[1], got[3]);
  // the towers really ran on two devices
  std::set<std::string> devices;
  for (const auto& e : trace.entries)
    if (e.kind == "matmul")
      devices.insert(e.device);
  CHECK(devices.count("/job:local/replica:0/task:0/device:CPU:0") == 1);
  CHECK(devices.count("/job:local/replica:0/task:0/device:CPU:1") == 1);
  // and the update applies the averaged gradient
  auto lr = s.constant(tensor::scalar(0.1f));
  auto w_before = value_of(s.run(w));
  auto w_after = value_of(s.run(s.assign_sub(w, s.mul(avg_w, lr))));
  for (size_t i = 0; i < 4; ++i)
    CHECK(w_after.at(i) == Approx(w_before.at(i) - 0.1 * got[2].at(i)).epsilon(1e-5));
}

TEMPLATE_TEST_CASE("a two-layer network split over two nodes trains like the same network on one",
                   "[compute][model-parallel]", CLUSTERS) {
  TestType c{{{"local", 2}}};
  auto s = c.connect("local", 0);
  auto x = s.constant(random32({6, 4}, 4));
  auto labels = s.constant(tensor::from_values<int32_t>({6}, {0, 2, 1, 1, 0, 2}));
  auto w1_init = random32({4, 5}, 5), w2_init = random32({5, 3}, 6);
  auto network = [&](const std::string& dev1, const std::string& dev2, const std::string& suffix) {
    output w1, w2, hidden, loss;
    {
      auto d = value_of(s.device(dev1));
      w1 = value_of(s.variable("w1" + suffix, {4, 5}, initializer::from_tensor(w1_init)));
      hidden = s.relu(s.matmul(x, w1, false, false, "layer1" + suffix));
    }
    {
      auto d = value_of(s.device(dev2));
      w2 = value_of(s.variable("w2" + suffix, {5, 3}, initializer::from_tensor(w2_init)));
      auto logits = s.matmul(hidden, w2, false, false, "layer2" + suffix);
      loss = s.reduce_mean(s.softmax_xent(logits, labels));
    }
    auto grads = value_of(s.gradients(loss, {w1, w2}));
    return std::vector<output>{loss, grads[0], grads[1]};
  };
  auto split = network("/job:local/task:0", "/job:local/task:1", "_split");
  auto single = network("/job:local/task:0", "/job:local/task:0", "_single");
  require_ok(s.initialize());
  run_trace trace;
  auto got = value_of(s.run({split[0], split[1], split[2], single[0], single[1], single[2]}, &trace));
  CHECK(got[0].at(0) == Approx(got[3].at(0)).epsilon(1e-5));
  require_close(got[1], got[4]);
  require_close(got[2], got[5]);
  REQUIRE(trace.find("layer1_split") != nullptr);
  REQUIRE(trace.find("layer2_split") != nullptr);
  CHECK(trace.find("layer1_split")->node == c.address("local", 0));
  // x [6,4] and w1 [4,5] in, [6,5] out, float32
  CHECK(trace.find("layer1_split")->bytes_in == (24 + 20) * 4);
  CHECK(trace.find("layer1_split")->bytes_out == 30 * 4);
  CHECK(trace.find("layer2_split")->node == c.address("local", 1));
  // The activations crossed from task 0 to task 1 (and their gradients
  // back), executor to executor; each variable was read on its own node.
  bool forward_edge = false, backward_edge = false;
  for (const auto& e : trace.entries) {
    if (e.kind != "transfer")
      continue;
    CHECK(e.op.find("w1_split") == std::string::npos);
    CHECK(e.op.find("w2_split") == std::string::npos);
    if (e.op.find("-> layer2_split") != std::string::npos) {
      forward_edge = true;
      CHECK(e.bytes_in == 30 * 4); // the relu'd activations, [6,5] float32
      CHECK(e.node == c.address("local", 1));
      CHECK(e.note.find("task:0") != std::string::npos);
    }
    if (e.node == c.address("local", 0) && e.note.find("task:1") != std::string::npos)
      backward_edge = true;
  }
  CHECK(forward_edge);
  CHECK(backward_edge);
  // the trace exports as Chrome trace events
  auto json = nlohmann::json::parse(trace.to_chrome_json());
  size_t spans = 0;
  std::set<int> pids;
  for (const auto& ev : json["traceEvents"])
    if (ev["ph"] == "X") {
      ++spans;
      pids.insert(ev["pid"].get<int>());
      CHECK(ev["dur"].get<double>() >= 0);
      CHECK(ev["args"].contains("bytes_in"));
    }
  CHECK(spans == trace.entries.size());
  CHECK(pids.size() == 2); // two nodes
}

TEST_CASE("a variable used by an op on another node shows as a transfer span", "[compute][trace]") {
  embedded_under_test c{{{"local", 2}}};
  bool data_plane = GENERATE(true, false);
  INFO("data plane: " << data_plane);
  c.defaults.data_plane = data_plane;
  auto s = c.connect("local", 0);
  output v;
  {
    auto d = value_of(s.device("/job:local/task:1"));
    v = value_of(s.variable("far", {2}, initializer::ones()));
  }
  require_ok(s.initialize());
  auto d = value_of(s.device("/job:local/task:0"));
  run_trace trace;
  auto y = value_of(s.run(s.add(v, v, "near_add"), &trace));
  CHECK(y.values<float>() == std::vector<float>{2, 2});
  auto e = trace.find("far");
  REQUIRE(e != nullptr);
  CHECK(e->kind == "transfer");
  CHECK(e->node == c.address("local", 1));
  CHECK(e->note.find("/job:local/replica:0/task:0/device:CPU:0") != std::string::npos);
  CHECK(e->note.find(data_plane ? "over the data plane" : "as CAF messages") != std::string::npos);
  CHECK(e->bytes_in == 8);
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
