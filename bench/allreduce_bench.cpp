// The all-reduce metrics of actorflow-bench (allreduce_bench.hpp): pairs of
// rank processes (allreduce_helpers.cpp) that time our ring (dist/allreduce.hpp)
// and a raw exchange of the same bytes. The small process helpers below are
// copies of bench_train.cpp's (spawn, wait_all, report), so that it need not
// export them.
#include "bench/allreduce_bench.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "bench/train_common.hpp"
#include "config/loopback.hpp"
#include "core/child_process.hpp"

namespace af::bench {

namespace {

// -- processes (as in bench_train.cpp) ---------------------------------------------------

/// A child: `args` exec'd with stdout and stderr into `log`, every other
/// descriptor closed but `keep`, killed if the bench dies.
child_process spawn(const std::vector<std::string>& args, const std::filesystem::path& log,
                    int keep = -1) {
  child_spec spec;
  spec.argv = args;
  spec.out = spec.err = child_output::file;
  spec.log_path = log.string();
  spec.close_fds = true;
  spec.keep_fd = keep;
  return child_process{spec};
}

/// Why a group of children failed: which one failed first, and how.
struct group_failure {
  size_t who = 0;
  std::string why;
};

/// Waits for every child until `deadline` (sooner once one has failed: its
/// peers would wait for it in vain) and kills those left.
std::optional<group_failure> wait_all(std::vector<child_process>& kids,
                                      const std::vector<std::string>& names,
                                      clock_type::time_point deadline) {
  std::vector<bool> done(kids.size(), false);
  std::optional<group_failure> failure;
  for (;;) {
    bool pending = false;
    for (size_t i = 0; i < kids.size(); ++i) {
      if (done[i])
        continue;
      auto status = kids[i].try_wait();
      if (!status) {
        pending = true;
        continue;
      }
      done[i] = true;
      bool ok = WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
      if (!ok && !failure) {
        failure = group_failure{i, names[i] + " " + child_process::describe(*status)};
        deadline = std::min(deadline, clock_type::now() + std::chrono::seconds(5));
      }
    }
    if (!pending)
      return failure;
    if (clock_type::now() > deadline) {
      for (size_t i = 0; i < kids.size(); ++i)
        if (!done[i]) {
          kids[i].signal(SIGKILL);
          if (!failure)
            failure = group_failure{i, names[i] + " still running after the deadline (killed)"};
        }
      return failure;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in{p};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The last line of `text` that is not empty, for failure messages.
std::string last_line(const std::string& text) {
  auto end = text.find_last_not_of("\n\r ");
  if (end == std::string::npos)
    return "(no output)";
  auto nl = text.rfind('\n', end);
  auto begin = nl == std::string::npos ? 0 : nl + 1;
  return text.substr(begin, end + 1 - begin);
}

/// "key value" lines of a helper's output.
std::map<std::string, double> parse_values(const std::string& text) {
  std::map<std::string, double> kv;
  std::istringstream in{text};
  std::string key;
  double value;
  while (in >> key >> value)
    kv[key] = value;
  return kv;
}

/// A scratch folder for configs and logs, removed at the end.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    char name[] = "/tmp/actorflow-bench-train-XXXXXX";
    if (mkdtemp(name))
      path = name;
  }
  ~scratch_dir() {
    std::error_code ec;
    if (!path.empty())
      std::filesystem::remove_all(path, ec);
  }
};

std::string self_exe() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

void report(const std::string& name, const std::vector<double>& ours,
            const std::vector<double>& base, const char* unit, const std::string& failure) {
  // every repetition, in the order they ran: how noisy this machine is now
  std::string reps = "# " + name + " reps: ours";
  for (double x : ours)
    reps += " " + exact(x, 4);
  reps += "; baseline";
  for (double x : base)
    reps += " " + exact(x, 4);
  std::printf("%s\n", reps.c_str());
  if (base.empty()) {
    std::printf("metric %s skipped: the baseline failed (see stderr)\n", name.c_str());
  } else if (!failure.empty() || ours.empty()) {
    std::printf("metric %s skipped: %s\n# %s baseline=%.3f unit=%s\n", name.c_str(),
                failure.empty() ? "no figure" : failure.c_str(), name.c_str(), median(base), unit);
  } else {
    auto o = median(ours), b = median(base);
    std::printf("metric %s ours=%.3f baseline=%.3f unit=%s ratio=%.3f\n", name.c_str(), o, b, unit,
                o / b);
  }
  std::fflush(stdout);
}

// -- the metrics ----------------------------------------------------------------------

/// The two figures of one pair of rank processes: our ring's and the raw
/// exchange's MB/s (of the 4 MiB buffer per all-reduce), rank 0's medians.
struct pair_figures {
  double ours = 0;
  double raw = 0;
};

/// One pair of ranks on `transport` ("tcp" or "shm"), or why none.
std::optional<pair_figures> run_pair(const std::string& transport, const train_bench_options& o,
                                     const scratch_dir& dir, std::string& failure) {
  uint16_t raw_port = 0;
  int lfd = listen_on_loopback(raw_port, 4);
  if (lfd < 0) {
    failure = "no loopback port for the raw exchange";
    return std::nullopt;
  }
  auto self = self_exe();
  auto port = free_loopback_port();
  std::vector<child_process> pids;
  std::vector<std::filesystem::path> logs;
  for (int rank = 0; rank < 2; ++rank) {
    logs.push_back(dir.path / ("ar-" + transport + std::to_string(rank) + ".log"));
    std::vector<std::string> args{self, helper_flag, "allreduce-pair", "rank=" + std::to_string(rank),
                                  "port=" + std::to_string(port), "transport=" + transport,
                                  "floats=" + std::to_string(model_floats),
                                  "rounds=" + std::to_string(o.allreduce_rounds), "warmup=5"};
    args.push_back(rank == 0 ? "listen-fd=" + std::to_string(lfd) : "raw-port=" + std::to_string(raw_port));
    pids.push_back(spawn(args, logs.back(), rank == 0 ? lfd : -1));
    if (rank == 0)
      close(lfd);
  }
  if (auto f = wait_all(pids, {"rank 0", "rank 1"}, clock_type::now() + o.timeout)) {
    failure = f->why + ": " + last_line(slurp(logs[f->who]));
    return std::nullopt;
  }
  auto r0 = parse_values(slurp(logs[0]));
  if (r0["ours_seconds"] <= 0 || r0["raw_seconds"] <= 0) {
    failure = "rank 0 printed no figures";
    return std::nullopt;
  }
  const double mb = model_floats * sizeof(float) / 1e6;
  return pair_figures{mb / r0["ours_seconds"], mb / r0["raw_seconds"]};
}

/// allreduce_4mib_2w_tcp or _shm: `reps` pairs of processes, each timing
/// both sides round by round.
void bench_allreduce(const std::string& transport, const train_bench_options& o,
                     const scratch_dir& dir) {
  const std::string name = "allreduce_4mib_2w_" + transport;
  std::vector<double> ours, base;
  std::string failure;
  for (int rep = 0; rep < o.reps && failure.empty(); ++rep)
    if (auto f = run_pair(transport, o, dir, failure)) {
      ours.push_back(f->ours);
      base.push_back(f->raw);
    }
  if (!failure.empty() && base.empty()) // the pair runs both: no baseline figure either
    std::printf("metric %s skipped: %s\n", name.c_str(), failure.c_str());
  else
    report(name, ours, base, "MB/s", failure);
}

} // namespace

const std::vector<std::string>& allreduce_metrics() {
  static const std::vector<std::string> names{"allreduce_4mib_2w_tcp", "allreduce_4mib_2w_shm"};
  return names;
}

void run_allreduce_benches(const std::vector<std::string>& wanted, const train_bench_options& opts) {
  scratch_dir dir;
  if (dir.path.empty()) {
    std::printf("# all-reduce metrics: skipped (no scratch folder in /tmp)\n");
    return;
  }
  for (auto transport : {"tcp", "shm"})
    if (std::find(wanted.begin(), wanted.end(), std::string{"allreduce_4mib_2w_"} + transport)
        != wanted.end())
      bench_allreduce(transport, opts, dir);
}

} // namespace af::bench
