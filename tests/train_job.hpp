#pragma once
// actorflow-train jobs for the multi-process tests (test_train_processes.cpp,
// test_train_elastic.cpp): one process per task of a between-graph job on
// free loopback ports, a worker that joins later with its own config, clients
// (--status, --switch) run beside it, and readers of what the job prints and
// writes. Every wait is bounded and waits on output lines, files or exits.
#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "config/loopback.hpp"
#include "process_cluster.hpp"
#include "temp_dir.hpp"

namespace af::testing {

namespace train_harness {

using af::testing::temp_dir;

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;


/// The last match of `re`'s first group in `text`.
inline std::optional<std::string> last_match(const std::string& text, const std::regex& re) {
  std::optional<std::string> found;
  for (std::sregex_iterator it{text.begin(), text.end(), re}, end; it != end; ++it)
    found = (*it)[1].str();
  return found;
}

/// Every match of `re`'s first group in `text`, in order.
inline std::vector<std::string> all_matches(const std::string& text, const std::regex& re) {
  std::vector<std::string> found;
  for (std::sregex_iterator it{text.begin(), text.end(), re}, end; it != end; ++it)
    found.push_back((*it)[1].str());
  return found;
}

/// How often `needle` occurs in `text` from `from` on.
inline size_t count_of(const std::string& text, const std::string& needle, size_t from = 0) {
  size_t n = 0;
  for (auto at = text.find(needle, from); at != std::string::npos;
       at = text.find(needle, at + needle.size()))
    ++n;
  return n;
}

/// The global steps of the chief's progress lines ("step S/T ..."), in order.
inline std::vector<uint64_t> progress_steps(const std::string& out) {
  static const std::regex re{R"((?:^|\n)step (\d+)/\d+ )"};
  std::vector<uint64_t> steps;
  for (const auto& s : all_matches(out, re))
    steps.push_back(std::stoull(s));
  return steps;
}

/// The global step of the chief's last progress line.
inline std::optional<uint64_t> last_progress_step(const std::string& out) {
  static const std::regex re{R"((?:^|\n)step (\d+)/\d+ )"};
  auto s = last_match(out, re);
  return s ? std::optional<uint64_t>{std::stoull(*s)} : std::nullopt;
}

/// The staleness of the chief's last async progress line: "staleness median M
/// max X histogram s:n s:n ..." (the last bucket "s+:n": s or more).
struct staleness_report {
  uint64_t median = 0;
  uint64_t max = 0;
  std::map<uint64_t, uint64_t> histogram; ///< staleness -> gradients applied with it
};
inline std::optional<staleness_report> last_staleness(const std::string& out) {
  static const std::regex line{R"(staleness median (\d+) max (\d+)\+? histogram((?: \d+\+?:\d+)*))"};
  std::optional<staleness_report> found;
  for (std::sregex_iterator it{out.begin(), out.end(), line}, end; it != end; ++it) {
    staleness_report r;
    r.median = std::stoull((*it)[1].str());
    r.max = std::stoull((*it)[2].str());
    static const std::regex bucket{R"( (\d+)\+?:(\d+))"};
    auto h = (*it)[3].str();
    for (std::sregex_iterator b{h.begin(), h.end(), bucket}, bend; b != bend; ++b)
      r.histogram[std::stoull((*b)[1].str())] += std::stoull((*b)[2].str());
    found = std::move(r);
  }
  return found;
}

/// From the chief's "train done: ... global_step=G ..." line.
inline std::optional<uint64_t> final_global_step(const std::string& out) {
  static const std::regex re{R"(train done: [^\n]*global_step=(\d+))"};
  auto s = last_match(out, re);
  return s ? std::optional<uint64_t>{std::stoull(*s)} : std::nullopt;
}

/// The most global steps an async job of `steps` steps and `workers`
/// workers may end at, with every push counted once: each worker pushes
/// once more if the step it read was below `steps`. With several ps it
/// reads the least of their steps, and two workers' pushes may reach two
/// ps in opposite orders, so that both read steps - 1.
inline uint64_t async_end_bound(uint64_t steps, uint32_t workers) {
  return steps + workers;
}

/// The total of the chief's progress lines ("step S/T ...").
inline std::optional<uint64_t> progress_total(const std::string& out) {
  static const std::regex re{R"((?:^|\n)step \d+/(\d+) )"};
  auto s = last_match(out, re);
  return s ? std::optional<uint64_t>{std::stoull(*s)} : std::nullopt;
}

/// From the chief's "held-out accuracy: A (N examples)" line.
inline std::optional<double> held_out_accuracy(const std::string& out) {
  static const std::regex re{R"(held-out accuracy: ([0-9.]+) \(\d+ examples\))"};
  auto s = last_match(out, re);
  return s ? std::optional<double>{std::stod(*s)} : std::nullopt;
}

/// One row of <metrics stem>.workers.csv (the chief writes one per worker
/// per progress report, all of a report from one stats answer of ps 0).
struct worker_row {
  uint64_t step = 0;
  double wall_s = 0;
  uint32_t worker = 0;
  std::string task, status;
  double examples_per_s = 0;
  uint64_t pushes = 0, applied = 0, late = 0, refused = 0, stale = 0, waited_ms = 0, clock = 0;
  uint64_t skipped = 0; ///< steps it did not send, told they had closed
};

/// The complete rows of a workers.csv so far (a line still being written,
/// without its newline, is left out).
inline std::vector<worker_row> read_worker_rows(const std::string& path) {
  std::ifstream f{path};
  std::stringstream ss;
  ss << f.rdbuf();
  auto text = ss.str();
  std::vector<worker_row> rows;
  size_t at = 0;
  bool header = true;
  for (auto nl = text.find('\n'); nl != std::string::npos; at = nl + 1, nl = text.find('\n', at)) {
    auto line = text.substr(at, nl - at);
    if (header) {
      header = false;
      continue;
    }
    std::vector<std::string> f;
    std::stringstream ls{line};
    for (std::string cell; std::getline(ls, cell, ',');)
      f.push_back(cell);
    if (f.size() != 14)
      continue;
    worker_row r;
    r.step = std::stoull(f[0]);
    r.wall_s = std::stod(f[1]);
    r.worker = static_cast<uint32_t>(std::stoul(f[2]));
    r.task = f[3];
    r.status = f[4];
    r.examples_per_s = std::stod(f[5]);
    r.pushes = std::stoull(f[6]);
    r.applied = std::stoull(f[7]);
    r.late = std::stoull(f[8]);
    r.refused = std::stoull(f[9]);
    r.stale = std::stoull(f[10]);
    r.waited_ms = std::stoull(f[11]);
    r.clock = std::stoull(f[12]);
    r.skipped = std::stoull(f[13]);
    rows.push_back(std::move(r));
  }
  return rows;
}

/// The rows of one report each (consecutive rows of one step and time).
inline std::vector<std::vector<worker_row>> reports_of(const std::vector<worker_row>& rows) {
  std::vector<std::vector<worker_row>> out;
  for (const auto& r : rows) {
    if (out.empty() || out.back().front().step != r.step || out.back().front().wall_s != r.wall_s
        || std::any_of(out.back().begin(), out.back().end(),
                       [&](const worker_row& o) { return o.worker == r.worker; }))
      out.emplace_back();
    out.back().push_back(r);
  }
  return out;
}

/// One worker's row of `actorflow-train --status` (from ps `ps`).
struct status_row {
  int ps = 0;
  uint32_t worker = 0;
  std::string task, status;
  uint64_t pushes = 0, applied = 0, late = 0, refused = 0, stale = 0;
};

/// The per-worker rows of a --status output, each with the ps it is under.
inline std::vector<status_row> parse_status(const std::string& out) {
  static const std::regex head{R"(^/job:ps/task:(\d+): mode )"};
  static const std::regex row{
    R"(^\s+(\d+) (\S+)\s+(\S+)\s+[0-9.]+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+[0-9.]+\s+\S+\s*$)"};
  std::vector<status_row> rows;
  int ps = -1;
  std::stringstream ss{out};
  for (std::string line; std::getline(ss, line);) {
    std::smatch m;
    if (std::regex_search(line, m, head)) {
      ps = std::stoi(m[1].str());
    } else if (ps >= 0 && std::regex_match(line, m, row)) {
      status_row r;
      r.ps = ps;
      r.worker = static_cast<uint32_t>(std::stoul(m[1].str()));
      r.task = m[2].str();
      r.status = m[3].str();
      r.pushes = std::stoull(m[4].str());
      r.applied = std::stoull(m[5].str());
      r.late = std::stoull(m[6].str());
      r.refused = std::stoull(m[7].str());
      r.stale = std::stoull(m[8].str());
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

/// What a job is: its tasks, its [train] table and each task's arguments.
struct job_spec {
  bool with_ps = true;
  int ps_tasks = 1; ///< with_ps: how many ps tasks
  int workers = 2;
  /// Worker addresses beyond `workers`, listed only in join_config(): the
  /// config of a worker that joins the running job (--join).
  int spare_workers = 0;
  std::vector<std::string> sets; ///< --set overrides, every task
  std::string train_table;       ///< the config file's [train] lines
  /// Extra arguments of a worker task, by index (e.g. --step-delay-ms).
  std::map<int, std::vector<std::string>> worker_args;
  /// Mutual TLS on both planes: actorflow-certs makes a CA and a
  /// certificate per task under dir/certs, and its [security] table goes
  /// into the config.
  bool secure = false;
  /// The program every task runs (tests/CMakeLists.txt: actorflow-train, or
  /// a test build of it such as actorflow-train-pausing).
  std::string binary = ACTORFLOW_TRAIN_BINARY;
};

/// The processes of one actorflow-train job: a config of fresh loopback ports
/// in `dir`, one process per task.
class train_job {
public:
  struct task {
    std::string job;
    int index = 0;
    std::unique_ptr<background_process> process;
    std::vector<std::string> argv; ///< how it was started (restart() runs it again)
    std::string name() const { return "/job:" + job + "/task:" + std::to_string(index); }
  };

  /// Starts the tasks and waits until every node is up; tries fresh ports
  /// when one was taken between choosing it and binding it.
  static std::unique_ptr<train_job> start(const std::string& dir, const job_spec& spec) {
    std::string last;
    std::string security; // the [security] table actorflow-certs printed
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::unique_ptr<train_job> j{new train_job};
      j->spec_ = spec;
      auto n = std::to_string(++config_counter());
      j->config_ = dir + "/job-" + n + ".toml";
      j->join_config_ = dir + "/job-" + n + "-join.toml";
      auto addr = [] { return "\"127.0.0.1:" + std::to_string(free_loopback_port()) + "\""; };
      std::string ps;
      for (int k = 0; spec.with_ps && k < spec.ps_tasks; ++k)
        ps += (k ? ", " : "") + addr();
      std::vector<std::string> workers;
      for (int w = 0; w < spec.workers + spec.spare_workers; ++w)
        workers.push_back(addr());
      auto write = [&](const std::string& path, int n_workers) {
        std::ofstream f{path};
        f << "[cluster]\n";
        if (spec.with_ps)
          f << "ps = [" << ps << "]\n";
        f << "worker = [";
        for (int w = 0; w < n_workers; ++w)
          f << (w ? ", " : "") << workers[static_cast<size_t>(w)];
        f << "]\n\n[train]\n" << spec.train_table;
        if (!security.empty())
          f << "\n" << security;
      };
      write(j->config_, spec.workers);
      if (spec.secure && security.empty()) {
        // The same files serve every attempt: a certificate names its
        // task and host, not its port.
        auto made = run_command({ACTORFLOW_CERTS_BINARY, "--config", j->config_}, std::chrono::seconds{60});
        auto at = made.output.find("[security]");
        if (made.exit_code != 0 || at == std::string::npos)
          FAIL("actorflow-certs failed:\n" << made.output);
        security = made.output.substr(at);
        write(j->config_, spec.workers);
      }
      if (spec.spare_workers > 0)
        write(j->join_config_, spec.workers + spec.spare_workers);
      // The ps first, the chief last: as an operator would start them (the
      // program waits for its peers either way).
      for (int k = 0; spec.with_ps && k < spec.ps_tasks; ++k)
        j->launch("ps", k, j->config_, {});
      for (int w = spec.workers - 1; w >= 0; --w)
        j->launch("worker", w, j->config_, {});
      if (j->wait_up(j->tasks_.size(), last))
        return j;
      if (last.find("bind_failed") == std::string::npos)
        break; // not a port race: say what happened
    }
    FAIL("the job's processes did not all come up:\n" << last);
    return nullptr;
  }

  /// The two-worker job of the older tests.
  static std::unique_ptr<train_job> start(const std::string& dir, bool with_ps,
                                          const std::vector<std::string>& sets,
                                          const std::string& train_table = "") {
    job_spec spec;
    spec.with_ps = with_ps;
    spec.sets = sets;
    spec.train_table = train_table;
    return start(dir, spec);
  }

  ~train_job() {
    kill_all();
  }

  /// Starts worker `index` (one of the spare workers) with join_config() and
  /// --join, and waits until its node is up.
  background_process& join(int index, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{"--join"};
    args.insert(args.end(), extra.begin(), extra.end());
    launch("worker", index, join_config_, args);
    std::string why;
    if (!wait_up(1, why))
      FAIL("the joining worker's node did not come up:\n" << why);
    return *tasks_.back().process;
  }

  /// Starts task `job`/`index` again as it was started (after it was
  /// killed: the test is the supervisor), in place of the old process, and
  /// waits until its node is up; its output starts afresh. `extra`
  /// arguments are added (a worker comes back with --join).
  background_process& restart(const std::string& job, int index,
                              const std::vector<std::string>& extra = {}) {
    auto& t = find(job, index);
    t.process->signal(SIGKILL); // a no-op if it is dead already
    auto argv = t.argv;
    argv.insert(argv.end(), extra.begin(), extra.end());
    t.process = std::make_unique<background_process>(argv);
    auto up = wait_until(
      [&] {
        return t.process->output().find("node up at") != std::string::npos
               || t.process->exit_code().has_value();
      },
      30s);
    if (!up || t.process->output().find("node up at") == std::string::npos)
      FAIL(t.name() << " did not come up again:\n" << describe());
    return *t.process;
  }

  /// Runs `actorflow-train --config <config()> ARGS` (a client: --status,
  /// --switch) to its end, reading every task's output meanwhile; exit code
  /// -1 if it was still running at `timeout` (then killed).
  command_result client(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
    std::vector<std::string> argv{ACTORFLOW_TRAIN_BINARY, "--config", config_};
    argv.insert(argv.end(), args.begin(), args.end());
    background_process p{argv};
    wait_until(
      [&] {
        p.read_output(0ms);
        return p.exit_code().has_value();
      },
      timeout);
    command_result r;
    p.read_output(0ms);
    auto code = p.exit_code();
    if (!code)
      p.signal(SIGKILL);
    r.exit_code = code ? *code : -1;
    r.output = p.output();
    return r;
  }

  background_process& chief() { return *find("worker", 0).process; }
  background_process& process(const std::string& job, int index) {
    return *find(job, index).process;
  }
  const std::string& config() const { return config_; }
  const std::string& join_config() const { return join_config_; }

  /// Waits until `cond` holds, reading every process's output meanwhile (so
  /// none blocks on a full pipe); false at the timeout.
  bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
    auto deadline = clock_type::now() + timeout;
    for (;;) {
      for (auto& t : tasks_)
        t.process->read_output(5ms);
      if (cond())
        return true;
      if (clock_type::now() >= deadline)
        return false;
    }
  }

  /// Waits until every process has exited; on timeout SIGKILLs the ones still
  /// running and returns their names ("" when all exited by themselves).
  std::string wait_all_exit(std::chrono::milliseconds timeout) {
    wait_until(
      [&] {
        for (auto& t : tasks_)
          if (!t.process->exit_code())
            return false;
        return true;
      },
      timeout);
    for (auto& t : tasks_) {
      t.process->read_output(0ms);
      // A teardown the watchdog cut short (programs/teardown_deadline.hpp):
      // the task ended in time, but its stop hung; said in every run's log.
      if (t.process->output().find("stopping took more than") != std::string::npos)
        WARN(t.name() << "'s teardown hung and was cut short:\n" << t.process->output());
    }
    std::string running;
    for (auto& t : tasks_)
      if (!t.process->exit_code()) {
        running += (running.empty() ? "" : ", ") + t.name();
        t.process->signal(SIGCONT); // a stopped one would not print its last lines
        t.process->signal(SIGKILL);
      }
    return running;
  }

  /// SIGKILLs every process still running (and reaps it).
  void kill_all() {
    for (auto& t : tasks_)
      t.process->signal(SIGKILL);
  }

  /// Every process's exit code (nullopt: still running) and output, for INFO.
  std::string describe() {
    std::string s;
    for (auto& t : tasks_) {
      t.process->read_output(0ms);
      auto code = t.process->exit_code();
      s += "--- " + t.name() + " (" + (code ? "exit " + std::to_string(*code) : "running")
           + "):\n" + t.process->output() + "\n";
    }
    return s;
  }

  const std::vector<task>& tasks() const { return tasks_; }

private:
  train_job() = default;

  static int& config_counter() {
    static int n = 0;
    return n;
  }

  void launch(const std::string& job, int index, const std::string& config,
              const std::vector<std::string>& extra) {
    std::vector<std::string> argv{spec_.binary, "--config", config, "--job", job,
                                  "--task", std::to_string(index)};
    for (const auto& kv : spec_.sets) {
      argv.push_back("--set");
      argv.push_back(kv);
    }
    if (job == "worker")
      if (auto it = spec_.worker_args.find(index); it != spec_.worker_args.end())
        argv.insert(argv.end(), it->second.begin(), it->second.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    tasks_.push_back({job, index, std::make_unique<background_process>(argv), argv});
  }

  /// Waits until the last `n` tasks launched print "node up at"; false (and
  /// `why`: every task's output) if one exits first or 30 s pass.
  bool wait_up(size_t n, std::string& why) {
    auto first = tasks_.size() - n;
    bool failed = false;
    bool up = wait_until(
      [&] {
        bool all = true;
        for (size_t i = first; i < tasks_.size(); ++i) {
          auto& t = tasks_[i];
          if (t.process->output().find("node up at") != std::string::npos)
            continue;
          all = false;
          failed = failed || t.process->exit_code().has_value();
        }
        return all || failed;
      },
      30s);
    if (up && !failed)
      return true;
    why = describe();
    return false;
  }

  task& find(const std::string& job, int index) {
    auto it = std::find_if(tasks_.begin(), tasks_.end(),
                           [&](const task& t) { return t.job == job && t.index == index; });
    INFO("/job:" << job << "/task:" << index);
    REQUIRE(it != tasks_.end());
    return *it;
  }

  job_spec spec_;
  std::string config_, join_config_;
  std::vector<task> tasks_;
};

} // namespace train_harness

using namespace train_harness;

} // namespace af::testing
