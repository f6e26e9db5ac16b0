#pragma once
// Real actorflow-node processes for tests: a generated config on free loopback
// ports, each node started and waited for (its "ready" line), stopped after.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/expected.hpp"
#include "core/child_process.hpp"

#include "config/cluster_spec.hpp"

namespace af::testing {

using clock_type_point = std::chrono::steady_clock::time_point;

/// Output and exit code of a program run to completion (killed at `timeout`).
struct command_result {
  int exit_code = -1;   ///< -1 if it was killed at the timeout
  std::string output;   ///< stdout and stderr together
};
command_result run_command(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                           const std::map<std::string, std::string>& env = {});

/// A program running beside the test (a client to kill), its output captured.
class background_process {
public:
  explicit background_process(const std::vector<std::string>& argv);
  ~background_process(); ///< SIGKILLs it if it still runs
  background_process(const background_process&) = delete;
  background_process& operator=(const background_process&) = delete;

  /// Waits until its output contains `text`; false at exit or timeout.
  bool wait_for(const std::string& text, std::chrono::milliseconds timeout);
  /// Sends `sig`; SIGKILL also reaps it; SIGSTOP returns once it has stopped
  /// (or exited).
  void signal(int sig);
  const std::string& output() const { return child_.output(); }
  pid_t pid() const { return child_.pid(); }

  /// Reads what it prints within `wait` (for a test that watches several
  /// processes, none of which may block on a full pipe); false once its
  /// output is closed.
  bool read_output(std::chrono::milliseconds wait);
  /// Its exit code (-1: ended by a signal) once it has exited, without
  /// blocking; nullopt while it runs.
  std::optional<int> exit_code();
  /// Waits up to `timeout` for it to exit, reading its output meanwhile;
  /// its exit code, or nullopt if it still runs.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);

private:
  child_process child_;
};

class process_cluster {
public:
  /// Starts one node per task; retries with new ports if one is taken meanwhile.
  static caf::expected<std::unique_ptr<process_cluster>>
  start(const std::map<std::string, int>& jobs, node_options opts = {},
        std::chrono::seconds timeout = std::chrono::seconds(30));

  ~process_cluster();

  const cluster_spec& spec() const { return spec_; }
  const std::string& config_path() const { return config_path_; }

  /// Sends SIGTERM and waits up to `timeout`; returns the exit code (-1: killed).
  int stop(const std::string& job, int32_t task,
           std::chrono::seconds timeout = std::chrono::seconds(10));

  /// Waits for a node to exit by itself (e.g. after a shutdown request).
  int wait_exit(const std::string& job, int32_t task,
                std::chrono::seconds timeout = std::chrono::seconds(10));

  /// What the node printed so far.
  std::string output(const std::string& job, int32_t task);

  /// Sends `sig` (SIGKILL, SIGSTOP, SIGCONT) to the node. After SIGKILL the
  /// node is reaped here; false if it is not running.
  bool signal(const std::string& job, int32_t task, int sig);

  /// Starts the node again on its address (after it exited or was killed)
  /// and waits for its ready line.
  caf::error restart(const std::string& job, int32_t task,
                     std::chrono::seconds timeout = std::chrono::seconds(30));

  /// The node's process id (-1 if it is not running).
  pid_t pid(const std::string& job, int32_t task);

private:
  struct proc {
    std::string job;
    int32_t task = 0;
    child_process child;
    int exit_code = -2; ///< -2: running
  };
  process_cluster() = default;
  proc* find(const std::string& job, int32_t task);
  void launch(proc& p);
  bool wait_ready(proc& p, clock_type_point deadline);
  int reap(proc& p, std::chrono::milliseconds timeout);
  std::vector<proc> procs_;
  cluster_spec spec_;
  std::string dir_;
  std::string config_path_;
};

} // namespace af::testing
