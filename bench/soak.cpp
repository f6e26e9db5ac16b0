// The soak (issue 11 §3): see bench/soak.hpp.
#include "bench/soak.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config/loopback.hpp"
#include "core/child_process.hpp"

namespace af::bench {

namespace {

/// One task of the soak's job: an actorflow-train process whose output goes
/// to a file (one per incarnation), so nothing has to drain a pipe.
struct soak_task {
  std::string job;
  int index = 0;
  child_process child;
  std::string log;          ///< this incarnation's output
  int incarnation = 0;
  double rss_start_mb = -1; ///< this incarnation's, once it trained a while
  std::chrono::steady_clock::time_point started{};
};

double rss_mb(pid_t pid) {
  std::ifstream f{"/proc/" + std::to_string(pid) + "/status"};
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stod(line.substr(6)) / 1024.0; // kB
  return -1;
}

std::string read_text(const std::string& path) {
  std::ifstream f{path};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

/// Starts (again) `t`: actorflow-train --config CONFIG --job J --task I [--join].
void soak_launch(soak_task& t, const std::string& bin, const std::string& config,
                 const std::string& dir, bool join) {
  t.incarnation += 1;
  t.log = dir + "/" + t.job + std::to_string(t.index) + "-" + std::to_string(t.incarnation)
          + ".log";
  child_spec spec;
  spec.argv = {bin, "--config", config, "--job", t.job, "--task", std::to_string(t.index)};
  if (join)
    spec.argv.push_back("--join");
  spec.out = spec.err = child_output::file;
  spec.log_path = t.log;
  t.child = child_process{spec};
  t.rss_start_mb = -1;
  t.started = std::chrono::steady_clock::now();
}

bool soak_running(soak_task& t) {
  return t.child.started() && !t.child.try_wait();
}

void soak_kill(soak_task& t) {
  t.child.signal(SIGKILL);
}

/// Waits up to `timeout` for `cond`, polling every 50 ms.
template <class Cond>
bool soak_wait(Cond cond, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

/// The job of one soak: its processes, its folder, what the chief printed.
class soak_job {
public:
  soak_job(const soak_options& o, std::string bin, std::string dir)
    : o_(o), bin_(std::move(bin)), dir_(std::move(dir)), rng_(o.seed) {
  }

  /// Writes the config and starts every task.
  void start() {
    auto port = [] { return "\"127.0.0.1:" + std::to_string(free_loopback_port()) + "\""; };
    config_ = dir_ + "/soak.toml";
    {
      std::ofstream f{config_};
      f << "[cluster]\nps = [" << port() << ", " << port() << "]\nworker = [" << port() << ", "
        << port() << "]\n\n[train]\nmode = \"sync\"\nsteps = 1000000000\ncheckpoint_dir = \""
        << dir_ << "/ckpt\"\ncheckpoint_steps = " << o_.checkpoint
        << "\nlog_every = 100\neval_every = 0\nps_recovery_timeout_ms = 60000\n"
           "step_timeout_ms = 60000\n";
    }
    std::printf("soak: %.0f s of sync training, 2 ps + 2 workers, a checkpoint every %llu steps, "
                "a kill -9 every %.0f s (seed %u); logs in %s\n",
                o_.seconds, static_cast<unsigned long long>(o_.checkpoint), o_.interval, o_.seed,
                dir_.c_str());
    std::fflush(stdout);
    auto task = [](const char* job, int index) {
      soak_task t;
      t.job = job;
      t.index = index;
      return t;
    };
    tasks_.push_back(task("ps", 0));
    tasks_.push_back(task("ps", 1));
    tasks_.push_back(task("worker", 1));
    tasks_.push_back(task("worker", 0));
    for (auto& t : tasks_)
      soak_launch(t, bin_, config_, dir_, false);
  }

  int run() {
    if (!soak_wait([&] { return last_step() > 0; }, std::chrono::seconds(60)))
      return fail("the chief printed no progress line within 60 s");
    t0_ = std::chrono::steady_clock::now();
    step_start_ = last_step();
    double next_fault = o_.interval;
    while (elapsed() < o_.seconds) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      sample_rss();
      if (!soak_running(chief()))
        return fail("the chief exited");
      if (elapsed() < next_fault)
        continue;
      next_fault = elapsed() + o_.interval;
      if (!fault())
        return 1;
    }
    return finish();
  }

private:
  soak_task& chief() { return tasks_[3]; }
  std::string chief_out() { return read_text(chief().log); }

  uint64_t last_step() {
    auto out = chief_out();
    auto at = out.rfind("\nstep ");
    if (at == std::string::npos)
      return 0;
    return std::stoull(out.substr(at + 6));
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

  void sample_rss() {
    for (auto& t : tasks_)
      if (t.rss_start_mb < 0 && t.child.running()
          && std::chrono::steady_clock::now() - t.started > std::chrono::seconds(5))
        t.rss_start_mb = rss_mb(t.child.pid());
  }

  int fail(const std::string& why) {
    std::printf("soak FAILED: %s (logs in %s)\n", why.c_str(), dir_.c_str());
    std::fflush(stdout);
    // Where each live process waits, beside its log, when gdb is there: a
    // hang seen once in 10 minutes is not seen again on demand.
    // (mkdtemp's directory has no quote; each gdb is bounded to 30 s.)
    if (::access("/usr/bin/gdb", X_OK) == 0)
      for (auto& t : tasks_)
        if (soak_running(t)) {
          auto out = dir_ + "/" + t.job + std::to_string(t.index) + "-"
                     + std::to_string(t.incarnation) + ".stacks";
          auto cmd = "timeout 30 /usr/bin/gdb -batch -p " + std::to_string(t.child.pid())
                     + " -ex 'thread apply all bt' > '" + out + "' 2>&1";
          int rc = std::system(cmd.c_str());
          std::printf("soak: stacks of /job:%s/task:%d %s %s\n", t.job.c_str(), t.index,
                      rc == 0 ? "in" : "not taken (gdb failed: ptrace not allowed?), see",
                      out.c_str());
        }
    for (auto& t : tasks_)
      soak_kill(t);
    return 1;
  }

  /// One fault: a random task of ps 0, ps 1, worker 1 killed and brought
  /// back; false (after fail()) if the job did not recover in time.
  bool fault() {
    auto& victim = tasks_[std::uniform_int_distribution<size_t>{0, 2}(rng_)];
    auto before = chief_out();
    auto step = last_step();
    auto t_kill = std::chrono::steady_clock::now();
    soak_kill(victim);
    faults_ += 1;
    std::string what;
    if (victim.job == "ps") {
      ps_faults_ += 1;
      soak_launch(victim, bin_, config_, dir_, false);
      auto n = occurrences(before, "ps recovered: ");
      if (!soak_wait([&] { return occurrences(chief_out(), "ps recovered: ") > n; },
                     std::chrono::seconds(90)))
        return fail("the chief did not restore /job:ps/task:" + std::to_string(victim.index)
                    + " within 90 s"), false;
      auto out = chief_out();
      auto at = out.rfind("ps recovered: ");
      what = out.substr(at, out.find('\n', at) - at);
    } else {
      worker_faults_ += 1;
      auto left = occurrences(before, ") left at global step");
      if (!soak_wait([&] { return occurrences(chief_out(), ") left at global step") > left; },
                     std::chrono::seconds(60)))
        return fail("the chief did not see worker 1 leave within 60 s"), false;
      auto joined = occurrences(before, ") joined at global step");
      soak_launch(victim, bin_, config_, dir_, true);
      if (!soak_wait([&] { return occurrences(chief_out(), ") joined at global step") > joined; },
                     std::chrono::seconds(60)))
        return fail("worker 1 did not rejoin within 60 s"), false;
      what = "worker 1 rejoined";
    }
    std::printf("soak: fault %d at %.1f s (step %llu): kill -9 /job:%s/task:%d; back in %.1f s: "
                "%s\n",
                faults_, elapsed(), static_cast<unsigned long long>(step), victim.job.c_str(),
                victim.index,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count(),
                what.c_str());
    std::fflush(stdout);
    return true;
  }

  /// The figures, then every process is stopped.
  int finish() {
    const uint64_t K = o_.checkpoint;
    auto out = chief_out();
    uint64_t lost = 0, beyond = 0, recoveries = 0;
    {
      std::regex re{R"(ps recovered: \S+ from .+ checkpoint_step=\d+ at global_step=\d+ lost=(\d+))"};
      for (std::sregex_iterator it{out.begin(), out.end(), re}, end; it != end; ++it) {
        auto l = std::stoull((*it)[1].str());
        recoveries += 1;
        lost += l;
        if (l > K)
          beyond += l - K;
      }
    }
    auto steps_done = last_step() - step_start_;
    std::printf("soak: %.0f s, %llu steps (%.1f steps/s), %d faults (%d ps, %d worker), %llu ps "
                "recoveries, %llu updates lost in all, %llu beyond one checkpoint interval (%llu)\n",
                elapsed(), static_cast<unsigned long long>(steps_done),
                static_cast<double>(steps_done) / elapsed(), faults_, ps_faults_, worker_faults_,
                static_cast<unsigned long long>(recoveries), static_cast<unsigned long long>(lost),
                static_cast<unsigned long long>(beyond), static_cast<unsigned long long>(K));
    bool flat = true;
    for (auto& t : tasks_) {
      double end = t.child.running() ? rss_mb(t.child.pid()) : -1;
      double ratio = t.rss_start_mb > 0 && end > 0 ? end / t.rss_start_mb : 0;
      std::printf("soak: /job:%s/task:%d incarnation %d: RSS %.1f MB at its start, %.1f MB at the "
                  "end (ratio %.3f)\n",
                  t.job.c_str(), t.index, t.incarnation, t.rss_start_mb, end, ratio);
      if (&t == &chief() && (ratio > 1.10 || ratio < 0.90))
        flat = false;
    }
    std::printf("metric soak steps=%llu faults=%d updates_lost=%llu lost_beyond_interval=%llu "
                "chief_rss_ratio=%.3f\n",
                static_cast<unsigned long long>(steps_done), faults_,
                static_cast<unsigned long long>(lost), static_cast<unsigned long long>(beyond),
                chief().rss_start_mb > 0 ? rss_mb(chief().child.pid()) / chief().rss_start_mb : 0.0);
    std::fflush(stdout);
    for (auto& t : tasks_)
      soak_kill(t);
    if (beyond > 0)
      return std::printf("soak FAILED: a recovery lost more than one checkpoint interval\n"), 1;
    if (!flat)
      std::printf("soak: the chief's RSS moved more than 10 %%\n");
    return flat ? 0 : 1;
  }

  soak_options o_;
  std::string bin_;
  std::string dir_;
  std::string config_;
  std::vector<soak_task> tasks_;
  std::mt19937 rng_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  uint64_t step_start_ = 0;
  int faults_ = 0;
  int ps_faults_ = 0;
  int worker_faults_ = 0;
};

} // namespace

int run_soak(const soak_options& opts, const std::string& bin) {
  char tmpl[] = "/tmp/actorflow-soak-XXXXXX";
  if (!mkdtemp(tmpl))
    return std::fprintf(stderr, "actorflow-soak: mkdtemp: %s\n", std::strerror(errno)), 1;
  soak_job job{opts, bin, tmpl};
  job.start();
  return job.run();
}

} // namespace af::bench
