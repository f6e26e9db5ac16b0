#include "process_cluster.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            int& out_fd) {
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    // A test process that is killed (a ctest timeout) must not leave nodes behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    for (const auto& [k, v] : env)
      setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::perror("execv");
    _exit(127);
  }
  close(fds[1]);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  out_fd = fds[0];
  return pid;
}

/// Reads what is available on `fd` into `out`, waiting at most `wait` for data.
/// Returns false at end of file.
bool read_some(int fd, std::string& out, std::chrono::milliseconds wait) {
  pollfd pfd{fd, POLLIN, 0};
  if (poll(&pfd, 1, static_cast<int>(wait.count())) <= 0)
    return true;
  char buf[4096];
  for (;;) {
    auto n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    return n < 0; // 0 = EOF; <0 = EAGAIN
  }
}

int decode(int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  return -1;
}

} // namespace

command_result run_command(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                           const std::map<std::string, std::string>& env) {
  command_result res;
  int fd = -1;
  pid_t pid = spawn(argv, env, fd);
  auto deadline = clock_type::now() + timeout;
  bool open = true;
  while (open && clock_type::now() < deadline)
    open = read_some(fd, res.output, std::chrono::milliseconds(100));
  // The child may close its output before it exits: wait for it, bounded too.
  int status = 0;
  bool exited = false;
  while (!exited && clock_type::now() < deadline) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited)
      read_some(fd, res.output, std::chrono::milliseconds(20));
  }
  if (exited) {
    res.exit_code = decode(status);
  } else {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    res.exit_code = -1;
  }
  close(fd);
  return res;
}

background_process::background_process(const std::vector<std::string>& argv) {
  pid_ = spawn(argv, {}, out_fd_);
}

background_process::~background_process() {
  signal(SIGKILL);
  if (out_fd_ >= 0)
    close(out_fd_);
}

bool background_process::wait_for(const std::string& text, std::chrono::milliseconds timeout) {
  auto deadline = clock_type::now() + timeout;
  while (output_.find(text) == std::string::npos && clock_type::now() < deadline)
    if (!read_some(out_fd_, output_, std::chrono::milliseconds(50)))
      break;
  return output_.find(text) != std::string::npos;
}

void background_process::signal(int sig) {
  if (pid_ <= 0 || reaped_)
    return;
  ::kill(pid_, sig);
  int status = 0;
  if (sig == SIGKILL) {
    waitpid(pid_, &status, 0);
    reaped_ = true;
    exit_code_ = decode(status);
  } else if (sig == SIGSTOP) {
    // kill() returns before the process has stopped: wait for the stop itself.
    if (waitpid(pid_, &status, WUNTRACED) == pid_ && !WIFSTOPPED(status)) {
      reaped_ = true;
      exit_code_ = decode(status);
    }
  }
}

bool background_process::read_output(std::chrono::milliseconds wait) {
  return out_fd_ >= 0 && read_some(out_fd_, output_, wait);
}

std::optional<int> background_process::exit_code() {
  if (pid_ <= 0)
    return -1;
  if (!reaped_) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_)
      return std::nullopt;
    reaped_ = true;
    exit_code_ = decode(status);
  }
  return exit_code_;
}

std::optional<int> background_process::wait_exit(std::chrono::milliseconds timeout) {
  auto deadline = clock_type::now() + timeout;
  bool open = true;
  for (;;) {
    // Reading comes first: a process blocked on a full pipe never exits.
    if (open)
      open = read_output(std::chrono::milliseconds(20));
    if (auto code = exit_code()) {
      read_output(std::chrono::milliseconds(0)); // what it printed last
      return code;
    }
    if (clock_type::now() >= deadline)
      return std::nullopt;
    if (!open) {
      // Its output is closed: wait on the exit itself (a pidfd turns readable
      // when the process ends), bounded by the deadline.
      int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
      if (pidfd < 0)
        return exit_code(); // no pidfd (old kernel): say what is known now
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      pollfd p{pidfd, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      ::close(pidfd);
    }
  }
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
                     + " did not report ready: " + p.output;
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
    if (p.exit_code == -2 && p.pid > 0)
      kill(p.pid, SIGTERM);
  for (auto& p : procs_)
    if (p.exit_code == -2 && p.pid > 0)
      reap(p, std::chrono::seconds(10));
  for (auto& p : procs_)
    if (p.out_fd >= 0)
      close(p.out_fd);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void process_cluster::launch(proc& p) {
  p.output.clear();
  p.exit_code = -2;
  p.pid = spawn({ACTORFLOW_NODE_BINARY, "--config", config_path_, "--job", p.job, "--task",
                 std::to_string(p.task)},
                {}, p.out_fd);
}

bool process_cluster::wait_ready(proc& p, clock_type_point deadline) {
  while (p.output.find("ready") == std::string::npos && clock_type::now() < deadline)
    if (!read_some(p.out_fd, p.output, std::chrono::milliseconds(100)))
      break; // exited
  return p.output.find("ready") != std::string::npos;
}

bool process_cluster::signal(const std::string& job, int32_t task, int sig) {
  auto p = find(job, task);
  if (p == nullptr || p->exit_code != -2)
    return false;
  if (::kill(p->pid, sig) != 0)
    return false;
  if (sig == SIGKILL)
    reap(*p, std::chrono::seconds(10));
  if (sig == SIGSTOP) {
    // kill() returns before the process has stopped: wait for the stop
    // itself (SIGSTOP cannot be caught, so it comes, or the process died).
    int status = 0;
    if (waitpid(p->pid, &status, WUNTRACED) == p->pid && !WIFSTOPPED(status))
      p->exit_code = decode(status);
  }
  return true;
}

caf::error process_cluster::restart(const std::string& job, int32_t task, std::chrono::seconds timeout) {
  auto p = find(job, task);
  if (p == nullptr)
    return make_error(af_error::not_found, "no node /job:" + job + "/task:" + std::to_string(task));
  if (p->exit_code == -2)
    return make_error(af_error::invalid_argument, "/job:" + job + "/task:" + std::to_string(task)
                                                    + " is still running; kill it first");
  if (p->out_fd >= 0)
    close(p->out_fd);
  auto deadline = clock_type::now() + timeout;
  // The old process's port may linger for a moment: try until the deadline.
  for (;;) {
    launch(*p);
    if (wait_ready(*p, deadline))
      return caf::none;
    reap(*p, std::chrono::seconds(2));
    close(p->out_fd);
    p->out_fd = -1;
    if (clock_type::now() >= deadline)
      return make_error(af_error::timeout, "/job:" + job + "/task:" + std::to_string(task)
                                             + " did not come back: " + p->output);
  }
}

pid_t process_cluster::pid(const std::string& job, int32_t task) {
  auto p = find(job, task);
  return p && p->exit_code == -2 ? p->pid : -1;
}

process_cluster::proc* process_cluster::find(const std::string& job, int32_t task) {
  for (auto& p : procs_)
    if (p.job == job && p.task == task)
      return &p;
  return nullptr;
}

void process_cluster::drain(proc& p, std::chrono::milliseconds wait) {
  if (p.out_fd >= 0)
    read_some(p.out_fd, p.output, wait);
}

int process_cluster::reap(proc& p, std::chrono::milliseconds timeout) {
  auto deadline = clock_type::now() + timeout;
  int status = 0;
  while (clock_type::now() < deadline) {
    drain(p, std::chrono::milliseconds(20));
    auto r = waitpid(p.pid, &status, WNOHANG);
    if (r == p.pid)
      return p.exit_code = decode(status);
  }
  kill(p.pid, SIGKILL);
  waitpid(p.pid, &status, 0);
  return p.exit_code = -1;
}

int process_cluster::stop(const std::string& job, int32_t task, std::chrono::seconds timeout) {
  auto p = find(job, task);
  if (p == nullptr || p->exit_code != -2)
    return p ? p->exit_code : -1;
  kill(p->pid, SIGTERM);
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
  drain(*p, std::chrono::milliseconds(0));
  return p->output;
}

} // namespace af::testing
