#include "core/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

extern char** environ;

namespace af {

namespace {

using clock_type = std::chrono::steady_clock;

/// Whether process `pid` is stopped: state T (a stop signal), or t (a
/// tracer's stop), in /proc/PID/stat.
bool stopped(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr)
    return false;
  char line[1024]; // "pid (name) state ...": the name is 15 bytes at most, of any bytes
  size_t n = std::fread(line, 1, sizeof(line) - 1, f);
  std::fclose(f);
  line[n] = '\0';
  const char* end = std::strrchr(line, ')'); // the name may hold ')'
  return end != nullptr && end[1] == ' ' && (end[2] == 'T' || end[2] == 't');
}

/// This process's environment with `spec`'s changes, as execve wants it.
std::vector<std::string> child_environment(const child_spec& spec) {
  std::vector<std::string> env;
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  auto changed = [&](const std::string& name) {
    if (std::find(spec.unset_env.begin(), spec.unset_env.end(), name) != spec.unset_env.end())
      return true;
    for (const auto& [k, v] : spec.set_env)
      if (k == name)
        return true;
    return false;
  };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    if (!changed(name_of(*e)))
      env.emplace_back(*e);
  for (const auto& [k, v] : spec.set_env)
    env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings)
    out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

/// Closes every descriptor from 3 up but those in `keep` (ascending, -1s
/// ignored). Async-signal-safe.
void close_all_but(int keep_a, int keep_b) {
  int lo = std::min(keep_a, keep_b);
  int hi = std::max(keep_a, keep_b);
  unsigned from = 3;
  for (int k : {lo, hi}) {
    if (k < static_cast<int>(from))
      continue;
    if (static_cast<unsigned>(k) > from)
      ::syscall(SYS_close_range, from, static_cast<unsigned>(k - 1), 0u);
    from = static_cast<unsigned>(k) + 1;
  }
  ::syscall(SYS_close_range, from, ~0u, 0u);
}

/// Points descriptor `to` at what `how` says; false if that failed.
bool redirect(int to, child_output how, int pipe_w, const char* log_path) {
  int fd = -1;
  switch (how) {
    case child_output::inherit:
      return true;
    case child_output::capture:
      return ::dup2(pipe_w, to) >= 0;
    case child_output::file:
      fd = ::open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      break;
    case child_output::discard:
      fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      break;
  }
  return fd >= 0 && ::dup2(fd, to) >= 0;
}

/// The child's side, between fork and exec: async-signal-safe calls only.
/// Writes errno to `report_w` and exits if the program cannot run.
[[noreturn]] void become(const child_spec& spec, const char* program, char** argv, char** envp,
                         int pipe_w, int report_w, pid_t parent) {
  if (spec.death_signal != 0) {
    ::prctl(PR_SET_PDEATHSIG, spec.death_signal);
    if (::getppid() != parent) // the parent died before prctl
      ::_exit(127);
  }
  bool ok = true;
  if (spec.stdin_null) {
    int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ok = fd >= 0 && ::dup2(fd, 0) >= 0;
  }
  ok = ok && redirect(1, spec.out, pipe_w, spec.log_path.c_str());
  // stderr going where stdout goes shares its descriptor (one file offset).
  if (spec.err == spec.out && spec.err != child_output::inherit)
    ok = ok && ::dup2(1, 2) >= 0;
  else
    ok = ok && redirect(2, spec.err, pipe_w, spec.log_path.c_str());
  if (ok && spec.close_fds)
    close_all_but(spec.keep_fd, report_w);
  if (ok)
    ::execve(program, argv, envp);
  int e = errno;
  (void)!::write(report_w, &e, sizeof e);
  ::_exit(127);
}

} // namespace

child_process::child_process(const child_spec& spec) : max_output_(spec.max_output) {
  const std::string program = spec.program.empty() && !spec.argv.empty() ? spec.argv[0]
                                                                          : spec.program;
  auto args = spec.argv;
  auto env = child_environment(spec);
  auto argv = pointers(args);
  auto envp = pointers(env);
  bool capture = spec.out == child_output::capture || spec.err == child_output::capture;
  int out[2] = {-1, -1};
  int report[2] = {-1, -1};
  auto fail = [&](const std::string& why) {
    start_error_ = "cannot run " + program + ": " + why;
    status_ = 127 << 8; // as a child whose exec failed: exited with 127
    for (int fd : {out[0], out[1], report[0], report[1]})
      if (fd >= 0)
        ::close(fd);
  };
  if ((capture && ::pipe2(out, O_CLOEXEC) != 0) || ::pipe2(report, O_CLOEXEC) != 0) {
    fail(std::strerror(errno));
    return;
  }
  // What the child inherits of this process's stdio buffers is lost at exec:
  // flush them so that nothing is printed twice or out of order.
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0)
    become(spec, program.c_str(), argv.data(), envp.data(), out[1], report[1], parent);
  if (pid < 0) {
    fail(std::string{"fork: "} + std::strerror(errno));
    return;
  }
  ::close(report[1]);
  report[1] = -1;
  int child_errno = 0;
  ssize_t n;
  while ((n = ::read(report[0], &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {
  }
  if (n > 0) { // exec failed: the child has exited, reap it
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    fail(std::strerror(child_errno));
    return;
  }
  ::close(report[0]);
  report[0] = -1;
  pid_ = pid;
  if (capture) {
    ::close(out[1]);
    out_fd_ = out[0];
    ::fcntl(out_fd_, F_SETFL, ::fcntl(out_fd_, F_GETFL) | O_NONBLOCK);
  }
}

child_process::~child_process() {
  signal(SIGKILL);
  close_output();
}

child_process::child_process(child_process&& other) noexcept {
  *this = std::move(other);
}

child_process& child_process::operator=(child_process&& other) noexcept {
  if (this != &other) {
    signal(SIGKILL);
    close_output();
    pid_ = std::exchange(other.pid_, -1);
    out_fd_ = std::exchange(other.out_fd_, -1);
    max_output_ = other.max_output_;
    status_ = std::exchange(other.status_, std::nullopt);
    cpu_seconds_ = std::exchange(other.cpu_seconds_, std::nullopt);
    output_ = std::move(other.output_);
    start_error_ = std::move(other.start_error_);
  }
  return *this;
}

void child_process::close_output() {
  if (out_fd_ >= 0)
    ::close(out_fd_);
  out_fd_ = -1;
}

bool child_process::read_output(std::chrono::milliseconds wait) {
  if (out_fd_ < 0)
    return false;
  pollfd pfd{out_fd_, POLLIN, 0};
  if (::poll(&pfd, 1, static_cast<int>(wait.count())) <= 0)
    return true;
  char buf[4096];
  for (;;) {
    auto n = ::read(out_fd_, buf, sizeof(buf));
    if (n > 0) {
      auto room = max_output_ - std::min(max_output_, output_.size());
      output_.append(buf, std::min(room, static_cast<size_t>(n)));
      continue;
    }
    if (n == 0) {
      close_output();
      return false;
    }
    return true; // EAGAIN (all read for now) or EINTR
  }
}

std::optional<int> child_process::try_wait() {
  if (status_ || pid_ <= 0)
    return status_;
  int status = 0;
  auto r = reap(WNOHANG, status);
  if (r == pid_)
    status_ = status;
  else if (r < 0 && errno == ECHILD)
    status_ = SIGKILL; // reaped elsewhere: gone, how is not known
  return status_;
}

std::optional<int> child_process::wait_for(std::chrono::milliseconds timeout) {
  auto deadline = clock_type::now() + timeout;
  bool open = out_fd_ >= 0;
  for (;;) {
    // Reading comes first: a process blocked on a full pipe never exits.
    if (open)
      open = read_output(std::chrono::milliseconds(20));
    if (auto status = try_wait()) {
      read_output(std::chrono::milliseconds(0)); // what it printed last
      return status;
    }
    if (clock_type::now() >= deadline)
      return std::nullopt;
    if (!open) {
      // Nothing to read: wait on the exit itself (a pidfd turns readable when
      // the process ends), bounded by the deadline.
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
      if (pidfd < 0) { // no pidfd (old kernel): poll
        std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(20)));
        continue;
      }
      pollfd p{pidfd, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      ::close(pidfd);
    }
  }
}

int child_process::wait() {
  while (read_output(std::chrono::milliseconds(-1))) {
  }
  if (!status_ && pid_ > 0) {
    int status = 0;
    pid_t r = reap(0, status);
    status_ = r == pid_ ? status : SIGKILL;
  }
  return status_.value_or(SIGKILL);
}

bool child_process::signal(int sig) {
  if (!running())
    return false;
  // A child stopped already does not report its stop again (it did when it
  // stopped): waiting for one would never end.
  bool stopped_before = sig == SIGSTOP && stopped(pid_);
  if (::kill(pid_, sig) != 0)
    return false;
  int status = 0;
  if (sig == SIGKILL) {
    pid_t r = reap(0, status);
    status_ = r == pid_ ? status : SIGKILL;
  } else if (sig == SIGSTOP && !stopped_before) {
    // kill() returns before the process has stopped: wait for the stop
    // itself (SIGSTOP cannot be caught, so it comes, or the process died).
    if (reap(WUNTRACED, status) == pid_ && !WIFSTOPPED(status))
      status_ = status;
  }
  return true;
}

pid_t child_process::reap(int options, int& status) {
  rusage usage{};
  pid_t r;
  while ((r = ::wait4(pid_, &status, options, &usage)) < 0 && errno == EINTR) {
  }
  if (r == pid_ && !WIFSTOPPED(status)) {
    auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
    cpu_seconds_ = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  }
  return r;
}

int child_process::exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string child_process::describe(int status) {
  if (WIFSIGNALED(status))
    return "died of signal " + std::to_string(WTERMSIG(status));
  return "exited with " + std::to_string(WEXITSTATUS(status));
}

} // namespace af
