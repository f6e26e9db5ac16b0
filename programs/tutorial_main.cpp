// actorflow-tutorial: the distributed-TensorFlow tutorial's examples.
//   actorflow-tutorial                      ps + 2 workers on an embedded cluster
//   actorflow-tutorial single-device        w + b, w * b with a location trace
//   actorflow-tutorial shared-var           two sessions share `var` by name
//   actorflow-tutorial ps-workers --config cluster.toml   against running nodes
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>

#include "caf/all.hpp"

#include "actors/embedded_cluster.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
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
  app.add_option("example", example, "single-device, shared-var or ps-workers")
    ->check(CLI::IsMember({"single-device", "shared-var", "ps-workers"}));
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
    auto ec = af::embedded_cluster::start(jobs);
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
    else
      ps_workers(c, increments, std::chrono::milliseconds{pause_ms});
  } catch (const std::exception& e) {
    std::cerr << "actorflow-tutorial: " << e.what() << std::endl;
    rc = 1;
  }
  return rc;
}
