// actorflow-tutorial: the distributed-TensorFlow tutorial's examples.
//   actorflow-tutorial                      ps + 2 workers on an embedded cluster
//   actorflow-tutorial single-device        w + b, w * b with a location trace
//   actorflow-tutorial shared-var           two sessions share `var` by name
//   actorflow-tutorial towers               two towers on cpu:0 and cpu:1, gradients averaged
//   actorflow-tutorial model-parallel       a two-layer network split over two nodes
//   actorflow-tutorial ps-workers --config cluster.toml   against running nodes
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include <CLI/CLI.hpp>

#include "caf/all.hpp"

#include "actors/embedded_cluster.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "kernels/kernels.hpp"
#include "messages/error.hpp"

namespace {

using namespace std::chrono_literals;

std::mutex print_mtx;

template <class... Ts>
void say(const char* fmt, Ts... xs) {
  std::lock_guard<std::mutex> guard{print_mtx};
  std::printf(fmt, xs...);
  std::printf("\n");
  std::fflush(stdout);
}

/// Where sessions come from: an embedded cluster or a real one.
struct cluster_access {
  std::unique_ptr<af::embedded_cluster> embedded;
  std::unique_ptr<af::system_config> client_cfg;
  std::unique_ptr<caf::actor_system> client_sys;
  af::cluster_spec spec;

  caf::expected<af::session> session_for(const std::string& job, int task) {
    if (embedded)
      return embedded->session_for(job, task);
    return af::session::make(*client_sys, spec, "/job:" + job + "/task:" + std::to_string(task));
  }
};

#define CHECK_OK(expr)                                                            \
  do {                                                                            \
    if (auto err_ = (expr))                                                       \
      throw std::runtime_error(af::describe(err_));                               \
  } while (false)

template <class T>
T ok(caf::expected<T> x) {
  if (!x)
    throw std::runtime_error(af::describe(x.error()));
  return std::move(*x);
}

void single_device(cluster_access& c, const std::string& job) {
  auto s = ok(c.session_for(job, 0));
  af::output w, b;
  {
    auto cpu = ok(s.device("/cpu:0"));
    w = ok(s.variable("w", {2, 2}, af::initializer::constant(2)));
    b = ok(s.variable("b", {2, 2}, af::initializer::constant(5)));
  }
  auto gpu = ok(s.device("/gpu:0"));
  auto addwb = s.add(w, b, "addwb");
  auto mutwb = s.mul(w, b, "mutwb");
  CHECK_OK(s.initialize());
  af::run_trace trace;
  auto res = ok(s.run({addwb, mutwb}, &trace));
  say("%s\n%s", res[0].to_string().c_str(), res[1].to_string().c_str());
  say("location trace:\n%s", trace.to_string().c_str());
}

void shared_var(cluster_access& c, const std::string& job) {
  auto s1 = ok(c.session_for(job, 0));
  auto s2 = ok(c.session_for(job, c.spec.num_tasks(job) > 1 ? 1 : 0));
  auto v1 = ok(s1.variable("var", {}));
  auto v2 = ok(s2.variable("var", {}));
  CHECK_OK(s1.initialize());
  say("Initial value of var in session 1: %s", ok(s1.run(v1)).to_string().c_str());
  say("Initial value of var in session 2: %s", ok(s2.run(v2)).to_string().c_str());
  ok(s1.run(s1.assign_add(v1, s1.constant(af::tensor::scalar(1)))));
  say("Incremented var in session 1");
  say("Value of var in session 1: %s", ok(s1.run(v1)).to_string().c_str());
  af::run_trace trace;
  say("Value of var in session 2: %s", ok(s2.run(v2, &trace)).to_string().c_str());
  say("location trace of session 2's read:\n%s", trace.by_device().c_str());
}

/// 单机多卡: two towers on cpu:0 and cpu:1 compute gradients of a linear model
/// on half a batch each; the CPU averages them and applies the update.
void towers(cluster_access& c, const std::string& job, int steps) {
  auto s = ok(c.session_for(job, 0));
  af::tensor x{af::dtype::float32, {8, 4}}, t{af::dtype::float32, {8, 1}};
  af::kernels::fill_uniform(x, -1, 1, 1);
  for (int64_t i = 0; i < 8; ++i) // the target: t = x . [1, -2, 3, 0.5] + 0.25
    t.mutable_data<float>()[i] = x.data<float>()[i * 4] - 2 * x.data<float>()[i * 4 + 1]
                                 + 3 * x.data<float>()[i * 4 + 2] + 0.5f * x.data<float>()[i * 4 + 3] + 0.25f;
  af::output w, b;
  {
    auto cpu = ok(s.device("/cpu:0"));
    w = ok(s.variable("w", {4, 1}, af::initializer::zeros()));
    b = ok(s.variable("b", {1}, af::initializer::zeros()));
  }
  auto half = [&](const af::tensor& m, int64_t from) {
    auto cols = m.shape()[1];
    auto all = m.values<float>();
    return af::tensor::from_values<float>({4, cols}, std::vector<float>(all.begin() + from * cols,
                                                                       all.begin() + (from + 4) * cols));
  };
  std::vector<std::vector<af::output>> grads;
  af::output loss0;
  for (int i = 0; i < 2; ++i) {
    auto dev = ok(s.device("/cpu:" + std::to_string(i)));
    auto pred = s.add(s.matmul(s.constant(half(x, 4 * i)), w), b);
    auto loss = s.reduce_mean(s.square(s.sub(pred, s.constant(half(t, 4 * i)))));
    if (i == 0)
      loss0 = loss;
    grads.push_back(ok(s.gradients(loss, {w, b})));
  }
  auto cpu0 = ok(s.device("/cpu:0"));
  auto lr_half = s.constant(af::tensor::scalar(0.5f * 0.2f)); // average, times the learning rate
  auto step_w = s.assign_sub(w, s.mul(s.add(grads[0][0], grads[1][0]), lr_half));
  auto step_b = s.assign_sub(b, s.mul(s.add(grads[0][1], grads[1][1]), lr_half));
  CHECK_OK(s.initialize());
  for (int i = 0; i < steps; ++i) {
    af::run_trace trace;
    auto r = ok(s.run({loss0, step_w, step_b}, &trace));
    if (i == 0) {
      std::set<std::string> devices;
      for (const auto& e : trace.entries)
        if (e.kind == "matmul")
          devices.insert(e.device);
      for (const auto& d : devices)
        say("tower ran on %s", d.c_str());
    }
    if (i % 20 == 0 || i == steps - 1)
      say("step %3d: loss of tower 0 = %.5f", i, r[0].at(0));
  }
  say("w = %s, b = %s (the data came from w = [1 -2 3 0.5], b = 0.25)",
      ok(s.run(w)).to_string().c_str(), ok(s.run(b)).to_string().c_str());
}

/// Model parallelism: layer 1 on task 0, layer 2 on task 1.
void model_parallel(cluster_access& c, const std::string& job) {
  auto s = ok(c.session_for(job, 0));
  af::tensor x{af::dtype::float32, {6, 4}};
  af::kernels::fill_uniform(x, -1, 1, 4);
  auto labels = s.constant(af::tensor::from_values<int32_t>({6}, {0, 2, 1, 1, 0, 2}));
  af::output w1, w2, hidden, loss;
  {
    auto d = ok(s.device("/job:" + job + "/task:0"));
    w1 = ok(s.variable("w1", {4, 5}, af::initializer::normal(0, 0.5, 1)));
    hidden = s.relu(s.matmul(s.constant(x), w1, false, false, "layer1"));
  }
  {
    auto d = ok(s.device("/job:" + job + "/task:1"));
    w2 = ok(s.variable("w2", {5, 3}, af::initializer::normal(0, 0.5, 2)));
    loss = s.reduce_mean(s.softmax_xent(s.matmul(hidden, w2, false, false, "layer2"), labels));
  }
  auto g = ok(s.gradients(loss, {w1, w2}));
  auto lr = s.constant(af::tensor::scalar(0.5f));
  auto step1 = s.assign_sub(w1, s.mul(g[0], lr));
  auto step2 = s.assign_sub(w2, s.mul(g[1], lr));
  CHECK_OK(s.initialize());
  for (int i = 0; i < 50; ++i) {
    af::run_trace trace;
    auto r = ok(s.run({loss, step1, step2}, &trace));
    if (i == 0)
      say("first step's trace:\n%s", trace.to_string().c_str());
    if (i % 10 == 0 || i == 49)
      say("step %2d: loss = %.5f", i, r[0].at(0));
  }
}

void ps_workers(cluster_access& c, int increments, std::chrono::milliseconds pause) {
  auto parameter_server = [&] {
    auto s = ok(c.session_for("ps", 0));
    af::output var;
    {
      auto d = ok(s.device("/job:ps/task:0"));
      var = ok(s.variable("var", {}));
    }
    say("Parameter server: initializing variables...");
    CHECK_OK(s.initialize());
    say("Parameter server: variables initialized");
    for (int i = 0; i < increments; ++i) {
      say("Parameter server: var has value %s", ok(s.run(var)).to_string().c_str());
      std::this_thread::sleep_for(pause);
    }
  };
  auto worker = [&](int n) {
    auto s = ok(c.session_for("worker", n));
    af::output var;
    {
      auto d = ok(s.device("/job:ps/task:0"));
      var = ok(s.variable("var", {}));
    }
    say("Worker %d: waiting for variable initialization...", n);
    CHECK_OK(s.wait_initialized(30s));
    say("Worker %d: variables initialized", n);
    auto inc = s.assign_add(var, s.constant(af::tensor::scalar(1)));
    for (int i = 0; i < increments; ++i) {
      auto v = ok(s.run(inc));
      say("Worker %d: incremented var to %s", n, v.to_string().c_str());
      std::this_thread::sleep_for(pause);
    }
  };
  std::vector<std::thread> tasks;
  std::vector<std::string> failures;
  auto guarded = [&](std::function<void()> f) {
    return std::thread{[&failures, f] {
      try {
        f();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> guard{print_mtx};
        failures.push_back(e.what());
      }
    }};
  };
  tasks.push_back(guarded(parameter_server));
  for (int n = 0; n < static_cast<int>(c.spec.num_tasks("worker")); ++n)
    tasks.push_back(guarded([&worker, n] { worker(n); }));
  for (auto& t : tasks)
    t.join();
  if (!failures.empty())
    throw std::runtime_error(failures.front());
  auto s = ok(c.session_for("ps", 0));
  auto var = ok(s.variable("var", {}));
  say("Final value of var on /job:ps/task:0: %s", ok(s.run(var)).to_string().c_str());
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"actorflow-tutorial: the distributed-TensorFlow tutorial's examples"};
  std::string example = "ps-workers", config_path;
  int increments = 5, pause_ms = 200;
  app.add_option("example", example, "single-device, shared-var, ps-workers, towers or model-parallel")
    ->check(CLI::IsMember({"single-device", "shared-var", "ps-workers", "towers", "model-parallel"}));
  app.add_option("-c,--config", config_path, "run against this cluster (default: an embedded one)");
  app.add_option("--increments", increments, "ps-workers: increments per worker");
  app.add_option("--pause-ms", pause_ms, "ps-workers: pause between steps, as the tutorial's sleep");
  CLI11_PARSE(app, argc, argv);

  af::tune_malloc_for_tensors();
  cluster_access c;
  if (config_path.empty()) {
    std::map<std::string, int> jobs;
    if (example == "ps-workers")
      jobs = {{"ps", 1}, {"worker", 2}};
    else
      jobs = {{"local", 2}};
    auto opts = af::embedded_cluster::defaults();
    opts.cpu_devices = 2; // so that "towers" has cpu:0 and cpu:1
    auto ec = af::embedded_cluster::start(jobs, opts);
    if (!ec) {
      std::cerr << "actorflow-tutorial: " << af::describe(ec.error()) << std::endl;
      return 1;
    }
    c.embedded = std::move(*ec);
    c.spec = c.embedded->spec();
    say("embedded cluster: %s", c.spec.to_json().c_str());
  } else {
    auto cfg = af::load_cluster_config(config_path);
    if (!cfg) {
      std::cerr << "actorflow-tutorial: " << af::describe(cfg.error()) << std::endl;
      return 2;
    }
    c.spec = cfg->cluster;
    af::node_options client_opts;
    client_opts.heartbeat_ms = 0;
    c.client_cfg = std::make_unique<af::system_config>(client_opts);
    c.client_sys = std::make_unique<caf::actor_system>(*c.client_cfg);
  }
  int rc = 0;
  try {
    auto first_job = c.spec.jobs().begin()->first;
    if (example == "single-device")
      single_device(c, first_job);
    else if (example == "shared-var")
      shared_var(c, first_job);
    else if (example == "towers")
      towers(c, first_job, 100);
    else if (example == "model-parallel")
      model_parallel(c, first_job);
    else
      ps_workers(c, increments, std::chrono::milliseconds{pause_ms});
  } catch (const std::exception& e) {
    std::cerr << "actorflow-tutorial: " << e.what() << std::endl;
    rc = 1;
  }
  return rc;
}
