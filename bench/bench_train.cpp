// The training benchmarks of actorflow-bench (issue 8); see bench_train.hpp.
// The helper processes (the raw baselines) are in train_helpers.cpp; the
// all-reduce metrics and their helpers in allreduce_bench.cpp.
#include "bench/bench_train.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "bench/allreduce_bench.hpp"
#include "bench/train_common.hpp"
#include "config/loopback.hpp"
#include "core/child_process.hpp"
#include "train/config.hpp"
#include "train/local.hpp"

namespace af::bench {

namespace {

// -- running processes -------------------------------------------------------------------

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

// -- the baselines ------------------------------------------------------------------------

/// Global steps/s of the raw ps with 2 raw workers, or nothing (why on stderr).
std::optional<double> raw_training(const std::string& mode, const train_bench_options& o,
                                   const scratch_dir& dir) {
  uint16_t port = 0;
  int lfd = listen_on_loopback(port, 16);
  if (lfd < 0)
    return std::nullopt;
  auto self = self_exe();
  auto floats = std::to_string(model_floats);
  std::vector<child_process> pids;
  std::vector<std::string> names{"raw ps", "raw worker 0", "raw worker 1"};
  pids.push_back(spawn({self, helper_flag, "raw-ps", "listen-fd=" + std::to_string(lfd),
                        "workers=2", "floats=" + floats, "mode=" + mode,
                        "lr=" + exact(linear_lr)},
                       dir.path / "raw-ps.log", lfd));
  close(lfd);
  for (int r = 0; r < 2; ++r)
    pids.push_back(spawn({self, helper_flag, "raw-worker", "rank=" + std::to_string(r),
                          "port=" + std::to_string(port), "floats=" + floats,
                          "steps=" + std::to_string(o.steps_1m),
                          "warmup=" + std::to_string(o.warmup_1m)},
                         dir.path / ("raw-worker" + std::to_string(r) + ".log")));
  if (auto failure = wait_all(pids, names, clock_type::now() + o.timeout)) {
    std::fprintf(stderr, "actorflow-bench: raw %s ps: %s\n", mode.c_str(), failure->why.c_str());
    return std::nullopt;
  }
  auto w0 = parse_values(slurp(dir.path / "raw-worker0.log"));
  auto w1 = parse_values(slurp(dir.path / "raw-worker1.log"));
  if (!w0.count("t1_ns") || !w1.count("t1_ns"))
    return std::nullopt;
  if (mode == "sync") // every worker takes every step
    return w0["steps"] / ((w0["t1_ns"] - w0["t0_ns"]) / 1e9);
  // async: every push is a global step, over the span both workers measured
  auto span = std::max(w0["t1_ns"], w1["t1_ns"]) - std::min(w0["t0_ns"], w1["t0_ns"]);
  return (w0["steps"] + w1["steps"]) / (span / 1e9);
}

// -- ours -----------------------------------------------------------------------------------

/// What a run of actorflow-train's cluster gave: the chief's `train done:`
/// fields, or why there are none.
struct cluster_run {
  std::map<std::string, double> done;
  std::string failure;
};

/// One training job of processes: `ps_tasks` ps and `workers` workers;
/// `worker_args[i]`: extra arguments of worker i (a straggler's delay).
cluster_run run_cluster(const std::vector<std::string>& train_keys, const train_bench_options& o,
                        const scratch_dir& dir, const std::string& tag, int ps_tasks = 1,
                        int workers = 2,
                        const std::map<int, std::vector<std::string>>& worker_args = {}) {
  cluster_run out;
  auto bin = o.bin_dir / "actorflow-train";
  if (!std::filesystem::exists(bin)) {
    out.failure = bin.string() + " not found (build the actorflow-train target)";
    return out;
  }
  std::vector<uint16_t> ports;
  for (int i = 0; i < ps_tasks + workers; ++i)
    ports.push_back(free_loopback_port());
  // The training keys go on the command line (--set), the file holds the
  // cluster only: the same keys whether or not the cluster loader accepts a
  // [train] table beside it.
  auto config = dir.path / (tag + ".toml");
  {
    std::ofstream out{config};
    out << "[cluster]\nps = [";
    for (int k = 0; k < ps_tasks; ++k)
      out << (k ? ", " : "") << "\"127.0.0.1:" << ports[k] << "\"";
    out << "]\nworker = [";
    for (int w = 0; w < workers; ++w)
      out << (w ? ", " : "") << "\"127.0.0.1:" << ports[ps_tasks + w] << "\"";
    out << "]\n";
  }
  struct task {
    std::string job;
    int index;
  };
  std::vector<task> tasks;
  for (int k = 0; k < ps_tasks; ++k)
    tasks.push_back({"ps", k});
  for (int w = 0; w < workers; ++w)
    tasks.push_back({"worker", w});
  std::vector<child_process> pids;
  std::vector<std::string> names;
  std::vector<std::filesystem::path> logs;
  for (auto& t : tasks) {
    std::vector<std::string> args{bin.string(), "--config", config.string(), "--job", t.job,
                                  "--task", std::to_string(t.index)};
    for (auto& sets : {train_keys, o.extra_sets})
      for (auto& kv : sets) {
        args.push_back("--set");
        args.push_back(kv);
      }
    if (auto extra = worker_args.find(t.index); t.job == "worker" && extra != worker_args.end())
      args.insert(args.end(), extra->second.begin(), extra->second.end());
    names.push_back(t.job + " " + std::to_string(t.index));
    logs.push_back(dir.path / (tag + "-" + t.job + std::to_string(t.index) + ".log"));
    pids.push_back(spawn(args, logs.back()));
  }
  if (auto failure = wait_all(pids, names, clock_type::now() + o.timeout)) {
    out.failure = failure->why + ": " + last_line(slurp(logs[failure->who]));
    return out;
  }
  auto chief_log = slurp(logs[static_cast<size_t>(ps_tasks)]);
  auto at = chief_log.find("train done:");
  if (at == std::string::npos) {
    out.failure = "the chief printed no `train done:` line: " + last_line(chief_log);
    return out;
  }
  std::istringstream line{chief_log.substr(at + 11, chief_log.find('\n', at) - at - 11)};
  std::string field;
  while (line >> field) {
    auto eq = field.find('=');
    if (eq == std::string::npos)
      continue;
    try {
      out.done[field.substr(0, eq)] = std::stod(field.substr(eq + 1));
    } catch (const std::exception&) {
      // mode=sync and the like: not a figure
    }
  }
  return out;
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

/// The steps/s of the chief's `train done:` line, or nullopt with `why` set.
std::optional<double> steps_per_s(const cluster_run& run, std::string& why) {
  if (!run.failure.empty()) {
    why = run.failure;
    return std::nullopt;
  }
  auto it = run.done.find("steps_per_s");
  if (it == run.done.end()) {
    why = "no steps_per_s in the chief's `train done:` line";
    return std::nullopt;
  }
  return it->second;
}

/// `key=value` of the [train] table for the 1 M-float linear regression.
std::vector<std::string> linear_keys(const std::string& mode, uint64_t steps) {
  return {"mode=" + mode, "model=linear", "data=synthetic_linear",
          "synthetic_features=" + std::to_string(model_floats),
          "synthetic_examples=" + std::to_string(synthetic_examples), "batch_size=1",
          "steps=" + std::to_string(steps), "learning_rate=" + exact(linear_lr), "log_every=0",
          "eval_every=0"};
}

void bench_linear(const std::string& mode, const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_" + mode + "_1m_2w";
  // async counts every push as a global step: 2x the steps, the same work per worker
  auto keys = linear_keys(mode, mode == "sync" ? o.steps_1m : 2 * o.steps_1m);
  std::vector<double> ours, base;
  std::string failure;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (auto b = raw_training(mode, o, dir))
      base.push_back(*b);
    if (failure.empty())
      if (auto x = steps_per_s(run_cluster(keys, o, dir, name), failure))
        ours.push_back(*x);
  }
  report(name, ours, base, "steps/s", failure);
}

/// The same sync job (1 ps + 2 worker processes on this host) with the data
/// plane on shared memory (the default between processes of one host)
/// against the same job with ACTORFLOW_DATA_SHM=off in its processes' environment (TCP over
/// loopback): what shared memory gains a whole job, alternating repetitions.
void bench_linear_shm(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_sync_1m_2w_shm_vs_tcp";
  auto keys = linear_keys("sync", o.steps_1m);
  const char* old = std::getenv("ACTORFLOW_DATA_SHM");
  std::string saved = old ? old : "";
  auto restore = [&] {
    if (old)
      setenv("ACTORFLOW_DATA_SHM", saved.c_str(), 1);
    else
      unsetenv("ACTORFLOW_DATA_SHM");
  };
  std::vector<double> ours, base;
  std::string failure, base_failure;
  for (int rep = 0; rep < o.reps; ++rep) {
    setenv("ACTORFLOW_DATA_SHM", "off", 1); // the children inherit it
    if (base_failure.empty()) {
      if (auto x = steps_per_s(run_cluster(keys, o, dir, name + "-tcp"), base_failure))
        base.push_back(*x);
      else
        std::fprintf(stderr, "actorflow-bench: %s baseline (TCP): %s\n", name.c_str(),
                     base_failure.c_str());
    }
    unsetenv("ACTORFLOW_DATA_SHM");
    if (failure.empty())
      if (auto x = steps_per_s(run_cluster(keys, o, dir, name), failure))
        ours.push_back(*x);
  }
  restore();
  report(name, ours, base, "steps/s", failure);
}

/// Sync with a straggler: 3 worker processes, one sleeping 3 steps' time in
/// each of its steps (4x slower), replicas_to_aggregate = 2, against 2
/// workers and no straggler (every gradient). Backup workers should make the
/// straggler cost nothing: the steps go at the speed of the other two.
void bench_straggler(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_sync_1m_3w_1slow";
  auto keys = linear_keys("sync", o.steps_1m);
  std::vector<double> ours, base;
  std::string failure, base_failure;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (base_failure.empty()) {
      if (auto x = steps_per_s(run_cluster(keys, o, dir, name + "-2w"), base_failure))
        base.push_back(*x);
      else
        std::fprintf(stderr, "actorflow-bench: %s baseline (2 workers): %s\n", name.c_str(),
                     base_failure.c_str());
    }
    if (failure.empty() && !base.empty()) {
      // 4x slower: a normal step's time (the baseline's), three more times.
      auto step_ms = static_cast<int>(3000.0 / base.back());
      auto with_backup = keys;
      with_backup.push_back("replicas_to_aggregate=2");
      auto run = run_cluster(with_backup, o, dir, name, 1, 3,
                             {{2, {"--step-delay-ms", std::to_string(std::max(1, step_ms))}}});
      if (auto x = steps_per_s(run, failure))
        ours.push_back(*x);
    }
  }
  report(name, ours, base, "steps/s", failure);
}

void bench_digits(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_digits_examples_per_s";
  train::train_config c;
  c.mode = "sync";
  c.model = "mlp";
  c.hidden = {128};
  c.data = "digits";
  c.batch_size = 32;
  c.steps = o.digits_steps;
  c.log_every = 0;
  c.eval_every = 0;
  std::vector<std::string> keys{"mode=sync",     "model=mlp",     "hidden=[128]", "data=digits",
                                "batch_size=32", "steps=" + std::to_string(o.digits_steps),
                                "log_every=0",   "eval_every=0"};
  auto data = train::load_data(c);
  if (!data) {
    std::printf("metric %s skipped: the digits: %s\n", name.c_str(),
                data.error().what.c_str());
    return;
  }
  std::vector<double> ours, base;
  std::string failure;
  for (int rep = 0; rep < o.reps; ++rep) {
    // the same examples in one process: one batch of 64 per global step
    if (auto local = train::train_local(c, *data, o.digits_steps, 64))
      base.push_back(local->examples_per_s);
    else
      std::fprintf(stderr, "actorflow-bench: local digits training: %s\n",
                   local.error().what.c_str());
    if (failure.empty()) {
      auto run = run_cluster(keys, o, dir, "digits");
      if (!run.failure.empty())
        failure = run.failure;
      else if (run.done.count("examples_per_s"))
        ours.push_back(run.done["examples_per_s"]);
      else
        failure = "no examples_per_s in the chief's `train done:` line";
    }
  }
  report(name, ours, base, "examples/s", failure);
}

/// Sync steps/s of a softmax regression of 3072 x 1024 (3.1 M floats, 12.6 MB)
/// with max_partitions = 3 over 3 ps processes, against the same job whole on
/// 1 ps process. On a machine with fewer cores than processes it measures the
/// cost of cutting and assembling the pieces, not the spread of the ps work.
void bench_partitioned(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_sync_partitioned_3ps";
  // A small learning rate: |x|^2 of the synthetic examples is ~features.
  std::vector<std::string> keys{"mode=sync",
                                "model=softmax",
                                "data=synthetic",
                                "synthetic_features=3072",
                                "synthetic_classes=1024",
                                "synthetic_examples=256",
                                "batch_size=4",
                                "steps=" + std::to_string(o.steps_1m),
                                "optimizer=sgd",
                                "learning_rate=0.001",
                                "log_every=0",
                                "eval_every=0"};
  auto cut = keys, whole = keys;
  cut.push_back("max_partitions=3");
  whole.push_back("max_partitions=1");
  std::vector<double> ours, base;
  std::string failure, base_failure;

  for (int rep = 0; rep < o.reps; ++rep) {
    if (base_failure.empty()) {
      if (auto b = steps_per_s(run_cluster(whole, o, dir, "whole-1ps", 1), base_failure))
        base.push_back(*b);
      else
        std::fprintf(stderr, "actorflow-bench: %s baseline (1 ps): %s\n", name.c_str(),
                     base_failure.c_str());
    }
    if (failure.empty())
      if (auto r = steps_per_s(run_cluster(cut, o, dir, "partitioned-3ps", 3), failure))
        ours.push_back(*r);
  }
  report(name, ours, base, "steps/s", failure);
}

} // namespace

const std::vector<std::string>& train_metrics() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v{"train_sync_1m_2w", "train_async_1m_2w"};
    for (auto& m : allreduce_metrics()) // bench/allreduce_bench.cpp
      v.push_back(m);
    for (auto m : {"train_digits_examples_per_s", "train_sync_partitioned_3ps",
                   "train_sync_1m_3w_1slow", "train_sync_1m_2w_shm_vs_tcp"})
      v.push_back(m);
    return v;
  }();
  return names;
}

void run_train_benches(const std::vector<std::string>& wanted, const train_bench_options& opts) {
  auto want = [&](const std::string& m) {
    return std::find(wanted.begin(), wanted.end(), m) != wanted.end();
  };
  scratch_dir dir;
  if (dir.path.empty()) {
    std::printf("# training metrics: skipped (no scratch folder in /tmp)\n");
    return;
  }
  std::printf("# training: 1 ps + 2 workers (processes) on loopback; %d reps each, alternating "
              "with the baseline; 1m: %lu sync steps, digits: %lu steps\n",
              opts.reps, static_cast<unsigned long>(opts.steps_1m),
              static_cast<unsigned long>(opts.digits_steps));
  std::fflush(stdout);
  if (want("train_sync_1m_2w"))
    bench_linear("sync", opts, dir);
  if (want("train_async_1m_2w"))
    bench_linear("async", opts, dir);
  run_allreduce_benches(wanted, opts); // those of allreduce_metrics() in `wanted`
  if (want("train_digits_examples_per_s"))
    bench_digits(opts, dir);
  if (want("train_sync_partitioned_3ps"))
    bench_partitioned(opts, dir);
  if (want("train_sync_1m_3w_1slow"))
    bench_straggler(opts, dir);
  if (want("train_sync_1m_2w_shm_vs_tcp"))
    bench_linear_shm(opts, dir);
}

} // namespace af::bench
