#pragma once
/// One way to start another program and see it end (issue 23): the tests'
/// node processes, the bench's helpers and clusters, the soak, the node's
/// supervisor and the gnuplot run all start children through this. Plain
/// POSIX (fork + execve), no CAF; the child between fork and exec calls only
/// async-signal-safe functions, so a process with threads may start one.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace af {

/// Where one of a child's output streams goes.
enum class child_output {
  inherit, ///< this process's own
  capture, ///< a pipe this process reads (stdout and stderr share one)
  file,    ///< child_spec::log_path, truncated (stdout and stderr share it)
  discard, ///< /dev/null
};

/// What to start and how.
struct child_spec {
  std::vector<std::string> argv;  ///< argv[0] is also the program's path, unless `program` is set
  std::string program;            ///< the file to execute when not argv[0] (/proc/self/exe)
  std::vector<std::pair<std::string, std::string>> set_env; ///< on top of this process's
  std::vector<std::string> unset_env;                        ///< removed from it
  child_output out = child_output::inherit;                  ///< stdout
  child_output err = child_output::inherit;                  ///< stderr
  std::string log_path;            ///< for child_output::file
  bool stdin_null = false;         ///< stdin from /dev/null instead of this process's
  /// Sent to the child when this process dies (0: none). Linux sends it when
  /// the thread that started the child ends: start children that must
  /// outlive a thread from one that lives as long as they should.
  int death_signal = 9;
  bool close_fds = false;          ///< close every descriptor above 2 but `keep_fd`
  int keep_fd = -1;                ///< one descriptor the child keeps (it must not be CLOEXEC)
  size_t max_output = SIZE_MAX;    ///< captured bytes kept; more are read and dropped
};

/// A started child. Destroying one that still runs kills it (SIGKILL) and
/// reaps it; a child is never left a zombie.
class child_process {
public:
  child_process() = default;
  /// Starts `spec`; see started() and start_error(). A program that cannot
  /// be executed (not found, not executable) is reported here, not as a
  /// child that exits.
  explicit child_process(const child_spec& spec);
  ~child_process();
  child_process(child_process&& other) noexcept;
  child_process& operator=(child_process&& other) noexcept;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  bool started() const { return pid_ > 0; }
  /// Why it did not start ("cannot run PATH: REASON"); empty if it did. One
  /// that did not start reads as ended with exit code 127 (try_wait...).
  const std::string& start_error() const { return start_error_; }
  /// The process id, also after it ended (-1 if it never started).
  pid_t pid() const { return pid_; }
  /// True from a successful start until it is reaped.
  bool running() const { return pid_ > 0 && !status_; }

  /// Reads what it printed within `wait` into output() (child_output::capture);
  /// false once its output is closed (or nothing is captured).
  bool read_output(std::chrono::milliseconds wait);
  /// Everything captured so far.
  const std::string& output() const { return output_; }

  /// Reaps it if it has ended, without blocking: its wait status
  /// (WIFEXITED...), or nullopt while it runs.
  std::optional<int> try_wait();
  /// Waits up to `timeout` for it to end, reading its output meanwhile (a
  /// child blocked on a full pipe never ends): its wait status, or nullopt if
  /// it still runs.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  /// Reads its output to the end and waits for it however long it takes.
  int wait();

  /// The CPU time (user and system) it used, once it has been reaped here
  /// (with that of the children it waited for itself); nullopt before, or
  /// where it was reaped elsewhere. What a benchmark divides by its steps.
  std::optional<double> cpu_seconds() const { return cpu_seconds_; }

  /// Sends `sig`; false if it is not running or kill() failed. SIGKILL
  /// also reaps it; SIGSTOP returns once it has stopped (or ended), also
  /// when it was stopped already.
  bool signal(int sig);

  /// The wait status's exit code, or -1 if a signal ended it.
  static int exit_code(int status);
  /// "exited with N" or "died of signal N".
  static std::string describe(int status);

private:
  void close_output();
  /// wait4 on the child with `options`, through EINTR; notes its CPU time
  /// when it ended.
  pid_t reap(int options, int& status);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  size_t max_output_ = SIZE_MAX;
  std::optional<int> status_;
  std::optional<double> cpu_seconds_;
  std::string output_;
  std::string start_error_;
};

} // namespace af
