// actorflow-node: one task of a cluster (TF's tf.train.Server + server.join()).
//   actorflow-node --config cluster.toml --job ps --task 0
//   TF_CONFIG='{"cluster":...,"task":{"type":"ps","index":0}}' actorflow-node
// Serves until SIGINT/SIGTERM or a client's shutdown request, then exits 0.
// Exits 2 if it cannot start (config, port), 1 if the node failed while serving.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>

#include "caf/all.hpp"

#include "actors/log.hpp"
#include "actors/node.hpp"
#include "actors/system.hpp"
#include "config/cluster_spec.hpp"
#include "messages/error.hpp"

namespace {

int fail(const std::string& msg, int code = 2) {
  af::log::get()->error("{}", msg); // the logger names the program (or the task)
  return code;
}

// SIGINT/SIGTERM may land on any thread, including ones libraries start
// before main (OpenBLAS's pool), so a handler forwards them through a pipe.
int signal_pipe[2] = {-1, -1};

extern "C" void forward_signal(int sig) {
  char c = static_cast<char>(sig);
  [[maybe_unused]] auto n = ::write(signal_pipe[1], &c, 1);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"actorflow-node: runs one task (ps or worker) of an actorflow cluster"};
  std::string config_path, job, bind, scheduler;
  int task = -1, cpu_devices = 0, threads = -1, data_port = -1;
  app.add_option("-c,--config", config_path, "cluster config file (TOML or JSON); default: $TF_CONFIG");
  app.add_option("-j,--job", job, "job name of this task (default: TF_CONFIG's task.type)");
  auto* task_flag =
    app.add_option("-t,--task", task, "task index within the job (default: TF_CONFIG's task.index)");
  app.add_option("--bind", bind, "address to listen on (default: the task's host from the config)");
  app.add_option("--cpu-devices", cpu_devices, "number of CPU devices (cpu:0..cpu:N-1)")->check(CLI::Range(1, 64));
  app.add_option("--threads", threads, "scheduler threads (0 = one per core)")->check(CLI::Range(0, 256));
  app.add_option("--data-port", data_port, "port of the tensor data plane (0 = any free one)")
    ->check(CLI::Range(0, 65535));
  app.add_option("--scheduler", scheduler, "CAF scheduler policy")->check(CLI::IsMember({"sharing", "stealing"}));
  CLI11_PARSE(app, argc, argv);
  af::log::init("actorflow-node");

  auto cfg = config_path.empty() ? af::cluster_config_from_env() : af::load_cluster_config(config_path);
  if (!cfg)
    return fail(af::describe(cfg.error()));
  if (job.empty())
    job = cfg->task_type.value_or("");
  if (task_flag->count() > 0 && task < 0)
    return fail("--task " + std::to_string(task) + " is not a task index: pass 0 or more");
  if (task < 0)
    task = cfg->task_index.value_or(job.empty() ? -1 : 0);
  if (job.empty() || task < 0)
    return fail("which task is this? pass --job NAME --task I (or set task in TF_CONFIG)");
  auto addr = cfg->cluster.address(job, task);
  if (!addr)
    return fail(af::describe(addr.error()));
  auto opts = cfg->node;
  if (!bind.empty()) opts.bind = bind;
  if (cpu_devices > 0) opts.cpu_devices = cpu_devices;
  if (threads >= 0) opts.threads = threads;
  if (data_port >= 0) opts.data_port = data_port;
  if (!scheduler.empty()) opts.scheduler = scheduler;

  if (::pipe2(signal_pipe, O_CLOEXEC) != 0)
    return fail("cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  af::tune_malloc_for_tensors();
  af::system_config sys_cfg{opts};
  caf::actor_system sys{sys_cfg};
  auto name = "/job:" + job + "/task:" + std::to_string(task);
  af::log::init(name);
  auto node = af::start_node(sys, job, task, opts.bind.empty() ? addr->host : opts.bind, addr->port, opts);
  if (!node)
    return fail(af::describe(node.error()));

  std::string devices;
  for (const auto& d : node->devices)
    devices += (devices.empty() ? "" : ",") + d;
  // Devices that failed to come up close the line, so that nobody mistakes
  // a node that lost its GPU for a CPU-only one.
  std::string broken;
  for (const auto& e : node->device_errors)
    broken += "; failed device " + e;
  std::printf("actorflow-node ready: %s at %s (devices %s; data plane port %u; scheduler %s x%zu; pid %d%s)\n",
              name.c_str(), addr->to_string().c_str(), devices.c_str(),
              static_cast<unsigned>(node->data_plane->port()), opts.scheduler.c_str(), sys_cfg.threads(),
              static_cast<int>(::getpid()), broken.c_str());
  std::fflush(stdout);

  std::thread signal_thread{[&] {
    char sig = 0;
    while (::read(signal_pipe[0], &sig, 1) < 0 && errno == EINTR)
      ; // retry
    if (sig != 0) { // 0: main's wake-up after the node stopped by itself
      std::printf("actorflow-node %s: signal %d, shutting down\n", name.c_str(), sig);
      std::fflush(stdout);
      caf::anon_send_exit(node->actor, caf::exit_reason::user_shutdown);
    }
  }};
  caf::error reason;
  {
    caf::scoped_actor self{sys, true};
    self->monitor(node->actor);
    // Serves until the node stops: asked to (shutdown, a signal) or failed.
    self->receive([&](caf::down_msg& dm) { reason = std::move(dm.reason); });
  }
  node->data_plane->stop();
  char wake = 0;
  [[maybe_unused]] auto n = ::write(signal_pipe[1], &wake, 1);
  signal_thread.join();
  if (reason && reason != caf::exit_reason::user_shutdown) {
    // Not a clean stop: an actor failed and took the node with it.
    af::log::get()->error("actorflow-node {}: the node failed: {}", name, af::describe(reason));
    return 1;
  }
  std::printf("actorflow-node %s: stopped\n", name.c_str());
  std::fflush(stdout);
  return 0;
}
