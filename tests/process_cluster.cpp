#include "process_cluster.hpp"

#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "config/loopback.hpp"
#include "messages/error.hpp"
#include "net/testing_hooks.hpp"

namespace af::testing {

namespace {

using clock_type = std::chrono::steady_clock;

/// `argv` started with `env` added, stdout and stderr captured; killed if
/// the test process is (a ctest timeout must not leave nodes behind).
child_process spawn(const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env = {}) {
  child_spec spec;
  spec.argv = argv;
  spec.set_env.assign(env.begin(), env.end());
  spec.out = spec.err = child_output::capture;
  return child_process{spec};
}

} // namespace

command_result run_command(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                           const std::map<std::string, std::string>& env) {
  command_result res;
  auto child = spawn(argv, env);
  // The child may close its output before it exits: the wait is bounded too.
  if (auto status = child.wait_for(timeout)) {
    res.exit_code = child_process::exit_code(*status);
  } else {
    child.signal(SIGKILL);
    res.exit_code = -1;
  }
  res.output = child.started() ? child.output() : child.start_error();
  return res;
}

background_process::background_process(const std::vector<std::string>& argv)
  : child_(spawn(argv)) {
}

background_process::~background_process() = default; // child_process SIGKILLs it

bool background_process::wait_for(const std::string& text, std::chrono::milliseconds timeout) {
  auto deadline = clock_type::now() + timeout;
  while (output().find(text) == std::string::npos && clock_type::now() < deadline)
    if (!child_.read_output(std::chrono::milliseconds(50)))
      break;
  return output().find(text) != std::string::npos;
}

void background_process::signal(int sig) {
  child_.signal(sig);
}

bool background_process::read_output(std::chrono::milliseconds wait) {
  return child_.read_output(wait);
}

std::optional<int> background_process::exit_code() {
  if (auto status = child_.try_wait())
    return child_process::exit_code(*status);
  return std::nullopt;
}

std::optional<int> background_process::wait_exit(std::chrono::milliseconds timeout) {
  if (auto status = child_.wait_for(timeout))
    return child_process::exit_code(*status);
  return std::nullopt;
}

caf::expected<std::unique_ptr<process_cluster>>
process_cluster::start(const std::map<std::string, int>& jobs, node_options opts,
                       std::chrono::seconds timeout) {
  std::string last_error;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_ptr<process_cluster> pc{new process_cluster};
    char tmpl[] = "/tmp/actorflow-test-XXXXXX";
    pc->dir_ = mkdtemp(tmpl);
    std::map<std::string, std::vector<std::string>> addrs;
    for (const auto& [job, n] : jobs)
      for (int i = 0; i < n; ++i)
        addrs[job].push_back("127.0.0.1:" + std::to_string(free_loopback_port()));
    auto spec = cluster_spec::from_jobs(addrs, "test cluster");
    if (!spec)
      return std::move(spec.error());
    pc->spec_ = *spec;
    pc->config_path_ = pc->dir_ + "/cluster.toml";
    std::ofstream{pc->config_path_}
      << pc->spec_.to_toml(opts)
      // The fabric this test binary trusts (its hook: net/testing_hooks.hpp),
      // the nodes trust through their config, as a program does.
      << (test_hooks_trust_fabric() ? "\n[security]\ntrusted_fabric = true\n" : "");
    for (const auto& [job, n] : jobs)
      for (int i = 0; i < n; ++i) {
        proc p;
        p.job = job;
        p.task = i;
        pc->launch(p);
        pc->procs_.push_back(std::move(p));
      }
    bool all_ready = true;
    auto deadline = clock_type::now() + timeout;
    for (auto& p : pc->procs_) {
      if (!pc->wait_ready(p, deadline)) {
        all_ready = false;
        last_error = "/job:" + p.job + "/task:" + std::to_string(p.task)
                     + " did not report ready: " + p.child.output();
        break;
      }
    }
    if (all_ready)
      return pc;
    // pc's destructor stops whatever started; try again with fresh ports
  }
  return make_error(af_error::internal, "could not start the test cluster: " + last_error);
}

process_cluster::~process_cluster() {
  for (auto& p : procs_)
    if (p.exit_code == -2)
      p.child.signal(SIGTERM);
  for (auto& p : procs_)
    if (p.exit_code == -2 && p.child.started())
      reap(p, std::chrono::seconds(10));
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void process_cluster::launch(proc& p) {
  p.exit_code = -2;
  p.child = spawn({ACTORFLOW_NODE_BINARY, "--config", config_path_, "--job", p.job, "--task",
                   std::to_string(p.task)});
}

bool process_cluster::wait_ready(proc& p, clock_type_point deadline) {
  while (p.child.output().find("ready") == std::string::npos && clock_type::now() < deadline)
    if (!p.child.read_output(std::chrono::milliseconds(100)))
      break; // exited
  return p.child.output().find("ready") != std::string::npos;
}

bool process_cluster::signal(const std::string& job, int32_t task, int sig) {
  auto p = find(job, task);
  if (p == nullptr || p->exit_code != -2)
    return false;
  // SIGKILL also reaps it; SIGSTOP returns once it has stopped (or died).
  if (!p->child.signal(sig))
    return false;
  if (sig == SIGKILL || sig == SIGSTOP)
    if (auto status = p->child.try_wait())
      p->exit_code = child_process::exit_code(*status);
  return true;
}

caf::error process_cluster::restart(const std::string& job, int32_t task, std::chrono::seconds timeout) {
  auto p = find(job, task);
  if (p == nullptr)
    return make_error(af_error::not_found, "no node /job:" + job + "/task:" + std::to_string(task));
  if (p->exit_code == -2)
    return make_error(af_error::invalid_argument, "/job:" + job + "/task:" + std::to_string(task)
                                                    + " is still running; kill it first");
  auto deadline = clock_type::now() + timeout;
  // The old process's port may linger for a moment: try until the deadline.
  for (;;) {
    launch(*p);
    if (wait_ready(*p, deadline))
      return caf::none;
    reap(*p, std::chrono::seconds(2));
    if (clock_type::now() >= deadline)
      return make_error(af_error::timeout, "/job:" + job + "/task:" + std::to_string(task)
                                             + " did not come back: " + p->child.output());
  }
}

pid_t process_cluster::pid(const std::string& job, int32_t task) {
  auto p = find(job, task);
  return p && p->exit_code == -2 ? p->child.pid() : -1;
}

process_cluster::proc* process_cluster::find(const std::string& job, int32_t task) {
  for (auto& p : procs_)
    if (p.job == job && p.task == task)
      return &p;
  return nullptr;
}

int process_cluster::reap(proc& p, std::chrono::milliseconds timeout) {
  if (auto status = p.child.wait_for(timeout))
    return p.exit_code = child_process::exit_code(*status);
  p.child.signal(SIGKILL);
  return p.exit_code = -1;
}

int process_cluster::stop(const std::string& job, int32_t task, std::chrono::seconds timeout) {
  auto p = find(job, task);
  if (p == nullptr || p->exit_code != -2)
    return p ? p->exit_code : -1;
  p->child.signal(SIGTERM);
  return reap(*p, timeout);
}

int process_cluster::wait_exit(const std::string& job, int32_t task, std::chrono::seconds timeout) {
  auto p = find(job, task);
  if (p == nullptr || p->exit_code != -2)
    return p ? p->exit_code : -1;
  return reap(*p, timeout);
}

std::string process_cluster::output(const std::string& job, int32_t task) {
  auto p = find(job, task);
  if (p == nullptr)
    return {};
  p->child.read_output(std::chrono::milliseconds(0));
  return p->child.output();
}

} // namespace af::testing
