// actorflow-tutorial: the distributed-TensorFlow tutorial's examples (tutorial/tutorial.hpp).
//   actorflow-tutorial                      ps + 2 workers on an embedded cluster
//   actorflow-tutorial single-device        w + b, w * b with a location trace
//   actorflow-tutorial shared-var           two sessions share `var` by name
//   actorflow-tutorial placement            var1 on task 0, var2 on task 1, traced from both
//   actorflow-tutorial same-variable        two graphs, one variable
//   actorflow-tutorial wait-for-init        one client waits for another to initialize
//   actorflow-tutorial towers               two towers on cpu:0 and cpu:1, gradients averaged
//   actorflow-tutorial model-parallel       a two-layer network split over two nodes
//   actorflow-tutorial ps-workers --config cluster.toml   against running nodes
// Exit code 1 when an example fails or does not reach what the tutorial says
// it reaches (ps-workers: var at workers x increments; towers, model-parallel:
// a loss that fell); 2 for a bad config.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "caf/all.hpp"

#include "dist/embedded_cluster.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "tutorial/tutorial.hpp"
#include "messages/error.hpp"
#include "programs/last_resort.hpp"

namespace {

void print_line(const std::string& text) {
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

int fail(const std::string& why) {
  std::cerr << "actorflow-tutorial: " << why << std::endl;
  return 1;
}

template <class T>
int fail_if(const caf::expected<T>& x) {
  return x ? 0 : fail(af::describe(x.error()));
}

/// The loss of the first step against that of the last: the training worked if it fell.
int loss_fell(const std::vector<double>& losses) {
  if (losses.size() < 2)
    return fail("too few steps to tell whether the loss fell");
  char line[128];
  std::snprintf(line, sizeof line, "from %.5f to %.5f", losses.front(), losses.back());
  if (!(losses.back() < losses.front()))
    return fail(std::string{"the loss did not fall: "} + line);
  print_line(std::string{"loss fell "} + line);
  return 0;
}

} // namespace

static int main_body(int argc, char** argv) {
  CLI::App app{"actorflow-tutorial: the distributed-TensorFlow tutorial's examples"};
  std::string example = "ps-workers", config_path;
  int increments = 5, pause_ms = 200;
  app.add_option("example", example,
                 "single-device, shared-var, placement, same-variable, wait-for-init, ps-workers, "
                 "towers or model-parallel")
    ->check(CLI::IsMember({"single-device", "shared-var", "placement", "same-variable",
                           "wait-for-init", "ps-workers", "towers", "model-parallel"}));
  app.add_option("-c,--config", config_path, "run against this cluster (default: an embedded one)");
  app.add_option("--increments", increments, "ps-workers: increments per worker")
    ->check(CLI::Range(1, 1000000));
  app.add_option("--pause-ms", pause_ms, "ps-workers: pause between steps, as the tutorial's sleep")
    ->check(CLI::Range(0, 3600000));
  CLI11_PARSE(app, argc, argv);

  af::tune_malloc_for_tensors();
  std::unique_ptr<af::embedded_cluster> embedded;
  std::unique_ptr<af::system_config> client_cfg;
  std::unique_ptr<caf::actor_system> client_sys;
  af::cluster_spec spec;
  if (config_path.empty()) {
    std::map<std::string, int> jobs;
    if (example == "ps-workers")
      jobs = {{"ps", 1}, {"worker", 2}};
    else
      jobs = {{"local", 2}};
    auto opts = af::embedded_cluster::defaults();
    opts.cpu_devices = 2; // so that "towers" has cpu:0 and cpu:1
    auto ec = af::embedded_cluster::start(jobs, opts);
    if (!ec)
      return fail(af::describe(ec.error()));
    embedded = std::move(*ec);
    spec = embedded->spec();
    print_line("embedded cluster: " + spec.to_json());
  } else {
    auto cfg = af::load_cluster_config(config_path);
    if (!cfg) {
      fail(af::describe(cfg.error()));
      return 2;
    }
    spec = cfg->cluster;
    af::node_options client_opts;
    client_opts.heartbeat_ms = 0;
    auto sec = af::security_for(cfg->security, "client");
    if (!sec) {
      fail(af::describe(sec.error()));
      return 2;
    }
    client_cfg = std::make_unique<af::system_config>(client_opts, *sec);
    client_sys = af::start_actor_system(*client_cfg);
  }
  af::tutorial::session_source sessions = [&](const std::string& job, int32_t task) {
    if (embedded)
      return embedded->session_for(job, task);
    return af::session::make(*client_sys, spec, "/job:" + job + "/task:" + std::to_string(task));
  };
  auto job = spec.jobs().begin()->first;
  auto second_task = static_cast<int32_t>(spec.num_tasks(job) > 1 ? 1 : 0);
  namespace tut = af::tutorial;
  int rc = 0;
  if (example == "single-device") {
    rc = fail_if(tut::single_device(sessions, job, print_line));
  } else if (example == "shared-var") {
    rc = fail_if(tut::shared_var(sessions, job, second_task, print_line));
  } else if (example == "placement") {
    rc = fail_if(tut::placement(sessions, job, print_line));
  } else if (example == "same-variable") {
    rc = fail_if(tut::same_variable(sessions, job, print_line));
  } else if (example == "wait-for-init") {
    rc = fail_if(tut::wait_for_initialization(sessions, job, {}, print_line));
  } else if (example == "towers") {
    auto r = tut::towers(sessions, job, {}, print_line);
    rc = r ? loss_fell(r->losses) : fail_if(r);
  } else if (example == "model-parallel") {
    auto r = tut::model_parallel(sessions, job, {}, print_line);
    rc = r ? loss_fell(r->losses) : fail_if(r);
  } else {
    tut::ps_workers_params params;
    params.workers = static_cast<int32_t>(spec.num_tasks("worker"));
    params.increments = increments;
    params.pause = std::chrono::milliseconds{pause_ms};
    auto r = tut::ps_workers(sessions, params, print_line);
    auto want = static_cast<double>(params.workers) * params.increments;
    if (!r)
      rc = fail_if(r);
    else if (r->final_value != want)
      rc = fail("var ended at " + std::to_string(r->final_value) + ", not at "
                + std::to_string(want) + ": an increment was lost or the variable was not "
                "initialized by this run");
  }
  return rc;
}

int main(int argc, char** argv) {
  return af::last_resort("actorflow-tutorial", [&] { return main_body(argc, argv); });
}
