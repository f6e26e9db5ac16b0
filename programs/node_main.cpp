// actorflow-node: one task of a cluster (TF's tf.train.Server + server.join()).
//   actorflow-node --config cluster.toml --job ps --task 0
//   TF_CONFIG='{"cluster":...,"task":{"type":"ps","index":0}}' actorflow-node
// Serves until SIGINT/SIGTERM or a client's shutdown request, then exits 0.
// Exits 2 if it cannot start (config, port, [security] files), 1 if the node
// failed while serving (the reason is logged).
//
// --restart-on-failure runs the node as a child process and starts it again
// (same arguments) when it exits non-zero or by a signal, with a backoff and
// a cap; SIGTERM/SIGINT to the supervisor stop the child and then itself.
// Production: systemd's Restart=on-failure does the same (docs/security.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "caf/all.hpp"

#include "net/aes_gcm.hpp"
#include "core/child_process.hpp"
#include "core/log.hpp"
#include "actors/node.hpp"
#include "dist/aggregator.hpp"
#include "actors/system.hpp"
#include "config/cluster_spec.hpp"
#include "messages/error.hpp"
#include "metrics/node_metrics.hpp"
#include "programs/last_resort.hpp"

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

// -- the supervisor of --restart-on-failure ----------------------------------

volatile sig_atomic_t supervisor_stop = 0;
volatile pid_t supervised_child = 0;

extern "C" void supervisor_signal(int sig) {
  supervisor_stop = sig;
  if (supervised_child > 0)
    ::kill(supervised_child, SIGTERM);
}

std::string describe_status(int status) {
  if (WIFEXITED(status))
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " ("
           + ::strsignal(WTERMSIG(status)) + ")";
  return "ended (status " + std::to_string(status) + ")";
}

/// Runs this program again without `--restart-on-failure` as a child, and
/// again after each abnormal end: backoff 0.5 s doubling to 10 s, at most
/// `max_restarts` in a row (a child that served a minute resets the count).
/// Set in a supervised child's environment: it serves and does not supervise.
constexpr const char* supervised_env = "ACTORFLOW_SUPERVISED";

int supervise(int argc, char** argv, int max_restarts) {
  af::child_spec node_spec;
  node_spec.program = "/proc/self/exe";
  for (int i = 0; i < argc; ++i)
    if (std::strcmp(argv[i], "--restart-on-failure") != 0
        && std::strncmp(argv[i], "--restart-on-failure=", 21) != 0)
      node_spec.argv.push_back(argv[i]);
  // A supervisor killed with SIGKILL takes its node along (it would hold the
  // port, and a new supervisor could not start one).
  node_spec.death_signal = SIGTERM;
  // The child serves and never supervises, whatever form the flag took.
  ::setenv(supervised_env, "1", 1);
  struct sigaction action {};
  action.sa_handler = supervisor_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  auto log = af::log::get();
  int restarts = 0;
  auto backoff = std::chrono::milliseconds{500};
  for (;;) {
    auto started = std::chrono::steady_clock::now();
    af::child_process child{node_spec};
    if (!child.started()) {
      log->error("supervisor: cannot start the node: {}", child.start_error());
      return 2;
    }
    supervised_child = child.pid();
    if (supervisor_stop != 0) // a signal between the start and here
      ::kill(child.pid(), SIGTERM);
    log->info("supervisor: node started, pid {}", child.pid());
    int status = child.wait(); // a signal is forwarded meanwhile
    supervised_child = 0;
    if (supervisor_stop != 0) {
      log->info("supervisor: signal {}: the node {}; stopping", static_cast<int>(supervisor_stop),
                describe_status(status));
      return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      log->info("supervisor: the node stopped cleanly; stopping");
      return 0;
    }
    if (std::chrono::steady_clock::now() - started > std::chrono::minutes{1}) {
      restarts = 0;
      backoff = std::chrono::milliseconds{500};
    }
    if (restarts >= max_restarts) {
      log->error("supervisor: the node {}; it failed {} times in a row, giving up",
                 describe_status(status), restarts + 1);
      return 1;
    }
    ++restarts;
    log->warn("supervisor: the node (pid {}) {}; restart {} of {} in {} ms", child.pid(),
              describe_status(status), restarts, max_restarts, backoff.count());
    // Sleeps in steps so that a SIGTERM during the backoff stops at once.
    auto until = std::chrono::steady_clock::now() + backoff;
    while (supervisor_stop == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds{20});
    if (supervisor_stop != 0) {
      log->info("supervisor: signal {} during the backoff; stopping",
                static_cast<int>(supervisor_stop));
      return 0;
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds{10000});
  }
}

/// [node] metrics_port's /metrics and /healthz beside `node`; null when it is 0.
caf::expected<std::unique_ptr<af::node_metrics>>
start_metrics(caf::actor_system& sys, const af::running_node& node, const std::string& name,
              const af::node_options& opts, const af::security_options& sec) {
  if (opts.metrics_port == 0)
    return std::unique_ptr<af::node_metrics>{};
  return af::start_node_metrics(sys, node, name, opts, sec);
}

} // namespace

static int main_body(int argc, char** argv) {
  CLI::App app{"actorflow-node: runs one task (ps or worker) of an actorflow cluster"};
  std::string config_path, job, bind, scheduler;
  int task = -1, cpu_devices = 0, threads = -1, data_port = -1, metrics_port = -1;
  app.add_option("-c,--config", config_path, "cluster config file (TOML or JSON); default: $TF_CONFIG");
  app.add_option("-j,--job", job, "job name of this task (default: TF_CONFIG's task.type)");
  auto* task_flag =
    app.add_option("-t,--task", task, "task index within the job (default: TF_CONFIG's task.index)");
  app.add_option("--bind", bind, "address to listen on (default: the task's host from the config)");
  app.add_option("--cpu-devices", cpu_devices, "number of CPU devices (cpu:0..cpu:N-1)")->check(CLI::Range(1, 64));
  app.add_option("--threads", threads, "scheduler threads (0 = one per core)")->check(CLI::Range(0, 256));
  app.add_option("--data-port", data_port, "port of the tensor data plane (0 = any free one)")
    ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-port", metrics_port,
                 "serve /metrics (Prometheus) and /healthz on this port of metrics_bind, "
                 "loopback by default (as [node] metrics_port; 0 = none)")
    ->check(CLI::Range(0, 65535));
  app.add_option("--scheduler", scheduler, "CAF scheduler policy")->check(CLI::IsMember({"sharing", "stealing"}));
  bool insecure = false, restart_on_failure = false;
  int max_restarts = 10;
  app.add_flag("--insecure", insecure,
               "allow plaintext ports on a non-loopback address (as [security] insecure = true)");
  app.add_flag("--restart-on-failure", restart_on_failure,
               "run the node as a child and restart it when it fails or is killed");
  app.add_option("--max-restarts", max_restarts, "with --restart-on-failure: failures in a row before giving up")
    ->check(CLI::Range(0, 1000));
  CLI11_PARSE(app, argc, argv);
  af::log::init("actorflow-node");
  if (restart_on_failure && std::getenv(supervised_env) == nullptr)
    return supervise(argc, argv, max_restarts);

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
  if (metrics_port >= 0) opts.metrics_port = metrics_port;
  if (!scheduler.empty()) opts.scheduler = scheduler;
  if (insecure) {
    if (cfg->security.enabled())
      return fail("--insecure and [security] certificates contradict each other: drop one");
    cfg->security.insecure = true;
  }
  auto security = af::security_for(cfg->security, af::security_member_name(job, task));
  if (!security)
    return fail(af::describe(security.error()));
  cfg->security = std::move(*security);

  auto name = "/job:" + job + "/task:" + std::to_string(task);
  if (auto err = opts.metrics_port == 0 ? caf::error{}
                                         : af::check_metrics_options(opts, cfg->security, name))
    return fail(af::describe(err)); // before the node's ports open
  if (::pipe2(signal_pipe, O_CLOEXEC) != 0)
    return fail("cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  af::tune_malloc_for_tensors();
  af::system_config sys_cfg{opts, cfg->security};
  auto sys_owner = af::start_actor_system(sys_cfg);
  caf::actor_system& sys = *sys_owner;
  af::log::init(name);
  auto node = af::start_node(sys, job, task, opts.bind.empty() ? addr->host : opts.bind, addr->port,
                             opts, cfg->security, af::node_aggregators());
  if (!node)
    return fail(af::describe(node.error()),
                af::is(node.error(), af::af_error::resource_exhausted) ? 1 : 2);
  if (!node->tls)
    af::log::get()->warn("{}", af::plaintext_warning());
  // /metrics and /healthz: stopped before the node's system goes (declared after it).
  auto metrics = start_metrics(sys, *node, name, opts, cfg->security);
  if (!metrics) {
    node->data_plane->stop();
    caf::anon_send_exit(node->actor, caf::exit_reason::user_shutdown);
    return fail(af::describe(metrics.error()));
  }

  std::string devices;
  for (const auto& d : node->devices)
    devices += (devices.empty() ? "" : ",") + d;
  // Devices that failed to come up close the line, so that nobody mistakes
  // a node that lost its GPU for a CPU-only one.
  std::string broken;
  for (const auto& e : node->device_errors)
    broken += "; failed device " + e;
  // Where it really listens, when --bind / [node] bind differs from the
  // task's address (0.0.0.0: every interface, which an operator must know).
  if (!opts.bind.empty() && opts.bind != addr->host)
    broken += "; listening on " + opts.bind;
  if (*metrics)
    broken += "; metrics on " + opts.metrics_bind + ":" + std::to_string((*metrics)->port());
  std::printf("actorflow-node ready: %s at %s (devices %s; data plane port %u; scheduler %s x%zu; %s; pid %d%s)\n",
              name.c_str(), addr->to_string().c_str(), devices.c_str(),
              static_cast<unsigned>(node->data_plane->port()), opts.scheduler.c_str(), sys_cfg.threads(),
              node->tls ? ("mutual TLS, data-plane records by "
                           + af::aes_gcm::describe(af::aes_gcm::best())).c_str()
                        : "plaintext",
              static_cast<int>(::getpid()), broken.c_str());
  std::fflush(stdout);

  std::thread signal_thread{[&] {
    char sig = 0;
    while (::read(signal_pipe[0], &sig, 1) < 0 && errno == EINTR)
      ; // retry
    if (sig != 0) { // 0: main's wake-up after the node stopped by itself
      std::printf("actorflow-node %s: signal %d, shutting down\n", name.c_str(), sig);
      std::fflush(stdout);
      if (*metrics)
        (*metrics)->shutting_down("signal " + std::to_string(sig));
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

int main(int argc, char** argv) {
  return af::last_resort("actorflow-node", [&] { return main_body(argc, argv); });
}
