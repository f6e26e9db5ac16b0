// The all-reduce metrics of actorflow-bench (allreduce_bench.hpp): pairs of
// rank processes (allreduce_helpers.cpp) that time our ring (dist/allreduce.hpp)
// and a raw exchange of the same bytes. The processes, their logs and the
// `metric` lines are train_run.hpp's, as for the training metrics.
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
#include "bench/train_run.hpp"
#include "config/loopback.hpp"
#include "core/child_process.hpp"

namespace af::bench {

namespace {

using train_run::last_line;
using train_run::parse_values;
using train_run::report;
using train_run::scratch_dir;
using train_run::self_exe;
using train_run::slurp;
using train_run::spawn;
using train_run::wait_all;

// -- the metrics ----------------------------------------------------------------------

/// The two figures of one pair of rank processes: our ring's and the raw
/// exchange's MB/s (of the 4 MiB buffer per all-reduce), rank 0's medians.
struct pair_figures {
  double ours = 0;
  double raw = 0;
  // per call, both ranks together: CPU time (us) and context switches
  double ours_cpu_us = 0, ours_switches = 0, raw_cpu_us = 0, raw_switches = 0;
  // per call, both ranks together: sends and receives on TCP, and sleeps
  double ours_io = 0, ours_sleeps = 0, raw_io = 0, raw_sleeps = 0;
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
  auto r1 = parse_values(slurp(logs[1]));
  const double mb = model_floats * sizeof(float) / 1e6;
  pair_figures f{mb / r0["ours_seconds"], mb / r0["raw_seconds"]};
  f.ours_cpu_us = r0["ours_cpu_us"] + r1["ours_cpu_us"];
  f.ours_switches = r0["ours_switches"] + r1["ours_switches"];
  f.raw_cpu_us = r0["raw_cpu_us"] + r1["raw_cpu_us"];
  f.raw_switches = r0["raw_switches"] + r1["raw_switches"];
  f.ours_io = r0["ours_io"] + r1["ours_io"];
  f.ours_sleeps = r0["ours_sleeps"] + r1["ours_sleeps"];
  f.raw_io = r0["raw_io"] + r1["raw_io"];
  f.raw_sleeps = r0["raw_sleeps"] + r1["raw_sleeps"];
  return f;
}

/// allreduce_4mib_2w_tcp or _shm: `reps` pairs of processes, each timing
/// both sides round by round.
void bench_allreduce(const std::string& transport, const train_bench_options& o,
                     const scratch_dir& dir) {
  const std::string name = "allreduce_4mib_2w_" + transport;
  std::vector<double> ours, base, cpu[2], switches[2], io[2], sleeps[2]; // [0]: ours, [1]: raw
  std::string failure;
  for (int rep = 0; rep < o.reps && failure.empty(); ++rep)
    if (auto f = run_pair(transport, o, dir, failure)) {
      ours.push_back(f->ours);
      base.push_back(f->raw);
      cpu[0].push_back(f->ours_cpu_us);
      cpu[1].push_back(f->raw_cpu_us);
      switches[0].push_back(f->ours_switches);
      switches[1].push_back(f->raw_switches);
      io[0].push_back(f->ours_io);
      io[1].push_back(f->raw_io);
      sleeps[0].push_back(f->ours_sleeps);
      sleeps[1].push_back(f->raw_sleeps);
    }
  if (!failure.empty() && base.empty()) { // the pair runs both: no baseline figure either
    std::printf("metric %s skipped: %s\n", name.c_str(), failure.c_str());
    return;
  }
  report(name, ours, base, "MB/s", failure);
  // What a call costs the two ranks, steadier than its time on a busy machine.
  if (cpu[0].empty())
    return;
  std::printf("# %s per call, both ranks: ours %.0f us CPU, %.1f context switches; baseline "
              "%.0f us CPU, %.1f context switches (medians of the reps)\n",
              name.c_str(), median(cpu[0]), median(switches[0]), median(cpu[1]),
              median(switches[1]));
  std::printf("# %s per call, both ranks: ours %.1f sends and receives on TCP, %.1f sleeps; "
              "baseline %.1f, %.1f (medians of the reps)\n",
              name.c_str(), median(io[0]), median(sleeps[0]), median(io[1]), median(sleeps[1]));
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
