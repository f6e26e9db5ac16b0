#pragma once
// The machinery of the training benchmarks (bench_train.cpp): child
// processes (the helpers and actorflow-train's), their logs, the clusters of
// actorflow-train, and the `metric` lines.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_train.hpp"
#include "bench/stats.hpp"
#include "core/child_process.hpp"

namespace af::bench::train_run {

/// A child: `args` exec'd with stdout and stderr into `log`, every other
/// descriptor closed but `keep`, killed if the bench dies.
child_process spawn(const std::vector<std::string>& args, const std::filesystem::path& log,
                    int keep = -1);

/// Why a group of children failed: which one failed first, and how.
struct group_failure {
  size_t who = 0;
  std::string why;
};

/// Waits for every child until `deadline` (sooner once one has failed: its
/// peers would wait for it in vain) and kills those left.
std::optional<group_failure> wait_all(std::vector<child_process>& kids,
                                      const std::vector<std::string>& names,
                                      clock_type::time_point deadline);

/// The CPU time (user and system) of the children that were reaped, summed.
double cpu_seconds_of(const std::vector<child_process>& kids);

/// The whole of a file ("" if it cannot be read).
std::string slurp(const std::filesystem::path& p);

/// The last line of `text` that is not empty, for failure messages.
std::string last_line(const std::string& text);

/// "key value" lines of a helper's output.
std::map<std::string, double> parse_values(const std::string& text);

/// A scratch folder for configs and logs, removed at the end.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir();
  ~scratch_dir();
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

/// This binary, for the helpers (re-executed).
std::string self_exe();

/// The data plane of the processes started while it lives: shared memory
/// (`on`: ACTORFLOW_DATA_SHM unset, the default between processes of one
/// host) or TCP (ACTORFLOW_DATA_SHM=off). The children inherit it.
class scoped_shm {
public:
  explicit scoped_shm(bool on);
  ~scoped_shm();
  scoped_shm(const scoped_shm&) = delete;
  scoped_shm& operator=(const scoped_shm&) = delete;

private:
  bool had_ = false;
  std::string saved_;
};

/// What a run of actorflow-train's cluster gave: the chief's `train done:`
/// fields, or why there are none.
struct cluster_run {
  std::map<std::string, double> done;
  std::string window; ///< `train done:`'s window= (measured, not_measured, cut_short), if any
  std::string window_why; ///< the chief's `window: not measured: ...` line, if it printed one
  double accuracy = -1; ///< the chief's `held-out accuracy:` line, if it printed one
  uint64_t scrapes = 0; ///< train_bench_options::metrics: /metrics answers while it ran
  double cpu_seconds = 0; ///< the CPU time (user and system) of all its processes, the whole run
  /// pipeline_sync = "auto": ps 0's last choice ("store-and-forward rounds:
  /// median period ..."), if it logged one
  std::string ps_choice;
  std::string failure;
};

/// One training job of processes: `ps_tasks` ps and `workers` workers;
/// `worker_args[i]`: extra arguments of worker i (a straggler's delay).
cluster_run run_cluster(const std::vector<std::string>& train_keys, const train_bench_options& o,
                        const scratch_dir& dir, const std::string& tag, int ps_tasks = 1,
                        int workers = 2,
                        const std::map<int, std::vector<std::string>>& worker_args = {});

/// `# NAME reps: ...` and `metric NAME ours=X baseline=Y unit=U ratio=Z`
/// (medians), or `metric NAME skipped: <why>` and the baseline as a `#` line.
void report(const std::string& name, const std::vector<double>& ours,
            const std::vector<double>& base, const char* unit, const std::string& failure);

/// The steps/s of the chief's `train done:` line, or nullopt with `why` set.
std::optional<double> steps_per_s(const cluster_run& run, std::string& why);

} // namespace af::bench::train_run
