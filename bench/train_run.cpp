// The machinery of the training benchmarks (bench_train.cpp): child
// processes, actorflow-train clusters, and the lines they report.
#include "bench/train_run.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "bench/scraper.hpp"
#include "bench/train_common.hpp"
#include "config/loopback.hpp"

namespace af::bench::train_run {

/// A child: `args` exec'd with stdout and stderr into `log`, every other
/// descriptor closed but `keep`, killed if the bench dies.
child_process spawn(const std::vector<std::string>& args, const std::filesystem::path& log,
                    int keep) {
  child_spec spec;
  spec.argv = args;
  spec.out = spec.err = child_output::file;
  spec.log_path = log.string();
  spec.close_fds = true;
  spec.keep_fd = keep;
  return child_process{spec};
}


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

double cpu_seconds_of(const std::vector<child_process>& kids) {
  double sum = 0;
  for (const auto& k : kids)
    sum += k.cpu_seconds().value_or(0.0);
  return sum;
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


std::string self_exe() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

scratch_dir::scratch_dir() {
  char name[] = "/tmp/actorflow-bench-train-XXXXXX";
  if (mkdtemp(name))
    path = name;
}

scratch_dir::~scratch_dir() {
  std::error_code ec;
  if (!path.empty())
    std::filesystem::remove_all(path, ec);
}

scoped_shm::scoped_shm(bool on) {
  const char* old = std::getenv("ACTORFLOW_DATA_SHM");
  had_ = old != nullptr;
  saved_ = old ? old : "";
  if (on)
    unsetenv("ACTORFLOW_DATA_SHM"); // the default between processes of one host
  else
    setenv("ACTORFLOW_DATA_SHM", "off", 1);
}

scoped_shm::~scoped_shm() {
  if (had_)
    setenv("ACTORFLOW_DATA_SHM", saved_.c_str(), 1);
  else
    unsetenv("ACTORFLOW_DATA_SHM");
}


/// One training job of processes: `ps_tasks` ps and `workers` workers;
/// `worker_args[i]`: extra arguments of worker i (a straggler's delay).
cluster_run run_cluster(const std::vector<std::string>& train_keys, const train_bench_options& o,
                        const scratch_dir& dir, const std::string& tag, int ps_tasks, int workers,
                        const std::map<int, std::vector<std::string>>& worker_args) {
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
  std::vector<uint16_t> metrics_ports; // o.metrics: each task's /metrics, scraped meanwhile
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
    if (o.metrics) {
      metrics_ports.push_back(free_loopback_port());
      args.insert(args.end(), {"--metrics-port", std::to_string(metrics_ports.back())});
    }
    if (auto extra = worker_args.find(t.index); t.job == "worker" && extra != worker_args.end())
      args.insert(args.end(), extra->second.begin(), extra->second.end());
    names.push_back(t.job + " " + std::to_string(t.index));
    logs.push_back(dir.path / (tag + "-" + t.job + std::to_string(t.index) + ".log"));
    pids.push_back(spawn(args, logs.back()));
  }
  scraper watcher{metrics_ports, std::chrono::milliseconds{o.scrape_ms}};
  auto failure = wait_all(pids, names, clock_type::now() + o.timeout);
  watcher.stop();
  out.scrapes = watcher.answered();
  out.cpu_seconds = cpu_seconds_of(pids);
  if (failure) {
    out.failure = failure->why + ": " + last_line(slurp(logs[failure->who]));
    return out;
  }
  if (ps_tasks > 0) { // pipeline_sync = "auto": the kind of round ps 0 kept last, and why
    auto ps_log = slurp(logs[0]);
    const std::string chose = "pipeline_sync = \"auto\" chose ";
    if (auto c = ps_log.rfind(chose); c != std::string::npos) {
      auto from = c + chose.size();
      out.ps_choice = ps_log.substr(from, ps_log.find(", over", from) - from);
    }
  }
  auto chief_log = slurp(logs[static_cast<size_t>(ps_tasks)]);
  auto at = chief_log.find("train done:");
  if (at == std::string::npos) {
    out.failure = "the chief printed no `train done:` line: " + last_line(chief_log);
    return out;
  }
  if (auto why = chief_log.find("window: not measured: "); why != std::string::npos)
    out.window_why = chief_log.substr(why + 22, chief_log.find('\n', why) - why - 22);
  if (auto acc = chief_log.find("held-out accuracy: "); acc != std::string::npos)
    out.accuracy = std::stod(chief_log.substr(acc + 19));
  std::istringstream line{chief_log.substr(at + 11, chief_log.find('\n', at) - at - 11)};
  std::string field;
  while (line >> field) {
    auto eq = field.find('=');
    if (eq == std::string::npos)
      continue;
    if (field.compare(0, eq, "window") == 0)
      out.window = field.substr(eq + 1);
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

} // namespace af::bench::train_run
