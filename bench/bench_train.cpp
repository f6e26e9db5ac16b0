// The training benchmarks of actorflow-bench (issues 8 and 24); see
// bench_train.hpp. The helper processes (the raw baselines) are in
// train_helpers.cpp; running processes and clusters in train_run.cpp; the
// all-reduce metrics and their helpers in allreduce_bench.cpp.
#include "bench/bench_train.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "bench/allreduce_bench.hpp"
#include "bench/raw_helpers.hpp"
#include "bench/train_common.hpp"
#include "bench/train_run.hpp"
#include "config/loopback.hpp"
#include "core/child_process.hpp"
#include "core/usable_cores.hpp"
#include "train/config.hpp"
#include "train/local.hpp"

namespace af::bench {

namespace {

using namespace train_run;

// -- the baselines ------------------------------------------------------------------------

/// What a raw ps of the 1 M workload and its 2 raw workers gave.
struct raw_run {
  double steps_per_s = 0;  ///< global steps/s of the window (the ps's count)
  double loss[2] = {0, 0}; ///< each worker's last loss
  /// The ps's and both workers' CPU over the whole run, per step (sync:
  /// per round; async: per push); none if the workers printed no steps.
  std::optional<double> cpu_ms_per_step;
};

/// The raw-TCP ps (`store`: store-and-forward, else pipelined) with 2 raw
/// workers over the timed window, or nothing (why on stderr).
std::optional<raw_run> raw_training(const std::string& mode, bool store,
                                    const train_bench_options& o, const scratch_dir& dir) {
  uint16_t port = 0;
  int lfd = listen_on_loopback(port, 16);
  if (lfd < 0)
    return std::nullopt;
  auto self = self_exe();
  auto floats = std::to_string(linear_features + 1);
  std::vector<child_process> pids;
  std::vector<std::string> names{"raw ps", "raw worker 0", "raw worker 1"};
  pids.push_back(spawn({self, helper_flag, "raw-ps", "listen-fd=" + std::to_string(lfd),
                        "workers=2", "floats=" + floats, "mode=" + mode,
                        "store=" + std::string{store ? "1" : "0"}, "lr=" + exact(linear_lr),
                        "warmup=" + exact(o.warmup_s), "window=" + exact(o.window_s)},
                       dir.path / "raw-ps.log", lfd));
  close(lfd);
  for (int r = 0; r < 2; ++r)
    pids.push_back(spawn({self, helper_flag, "raw-worker", "rank=" + std::to_string(r),
                          "port=" + std::to_string(port), "floats=" + floats,
                          "seed=" + std::to_string(linear_seed)},
                         dir.path / ("raw-worker" + std::to_string(r) + ".log")));
  const char* kind = store ? "store-and-forward" : "pipelined";
  if (auto failure = wait_all(pids, names, clock_type::now() + o.timeout)) {
    std::fprintf(stderr, "actorflow-bench: raw %s %s ps: %s: %s\n", mode.c_str(), kind,
                 failure->why.c_str(),
                 last_line(slurp(dir.path / (failure->who == 0 ? std::string{"raw-ps.log"}
                                             : "raw-worker" + std::to_string(failure->who - 1)
                                                 + ".log")))
                   .c_str());
    return std::nullopt;
  }
  auto ps = parse_values(slurp(dir.path / "raw-ps.log"));
  if (!ps.count("window_seconds") || ps["window_seconds"] <= 0)
    return std::nullopt;
  raw_run out;
  out.steps_per_s = ps["window_steps"] / ps["window_seconds"];
  // Sync: the rounds, which each worker joined (one may have ended a round
  // after the other); async: both workers' pushes.
  double steps = 0;
  for (int r = 0; r < 2; ++r) {
    auto w = parse_values(slurp(dir.path / ("raw-worker" + std::to_string(r) + ".log")));
    out.loss[r] = w["loss"];
    steps = mode == "sync" ? std::max(steps, w["steps"]) : steps + w["steps"];
  }
  if (steps > 0)
    out.cpu_ms_per_step = cpu_seconds_of(pids) * 1e3 / steps;
  return out;
}

/// The raw shared-memory ps (sync, store-and-forward; raw_shm_ps.cpp) with
/// 2 raw workers over the timed window, or nothing (why on stderr).
std::optional<raw_run> raw_shm_training(const train_bench_options& o, const scratch_dir& dir) {
  static int made = 0;
  auto name = "/actorflow-bench-raw-" + std::to_string(getpid()) + "-" + std::to_string(made++);
  const size_t floats = linear_features + 1;
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(raw_shm_segment_bytes(floats, 2))) != 0) {
    std::fprintf(stderr, "actorflow-bench: raw shm ps: cannot make %s: %s\n", name.c_str(),
                 std::strerror(errno));
    if (fd >= 0)
      close(fd), shm_unlink(name.c_str());
    return std::nullopt;
  }
  close(fd);
  auto self = self_exe();
  std::vector<std::string> common{"shm=" + name, "floats=" + std::to_string(floats)};
  auto args = [&](std::vector<std::string> v) {
    v.insert(v.begin(), {self, helper_flag});
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };
  std::vector<child_process> pids;
  pids.push_back(spawn(args({"raw-shm-ps", "lr=" + exact(linear_lr), "warmup=" + exact(o.warmup_s),
                             "window=" + exact(o.window_s)}),
                       dir.path / "raw-shm-ps.log"));
  for (int r = 0; r < 2; ++r)
    pids.push_back(spawn(args({"raw-shm-worker", "rank=" + std::to_string(r),
                               "seed=" + std::to_string(linear_seed)}),
                         dir.path / ("raw-shm-worker" + std::to_string(r) + ".log")));
  auto failure = wait_all(pids, {"raw shm ps", "raw shm worker 0", "raw shm worker 1"},
                          clock_type::now() + o.timeout);
  shm_unlink(name.c_str());
  if (failure) {
    std::fprintf(stderr, "actorflow-bench: raw shm ps: %s\n", failure->why.c_str());
    return std::nullopt;
  }
  auto ps = parse_values(slurp(dir.path / "raw-shm-ps.log"));
  if (!ps.count("window_seconds") || ps["window_seconds"] <= 0)
    return std::nullopt;
  raw_run out;
  out.steps_per_s = ps["window_steps"] / ps["window_seconds"];
  for (int r = 0; r < 2; ++r)
    out.loss[r] =
      parse_values(slurp(dir.path / ("raw-shm-worker" + std::to_string(r) + ".log")))["loss"];
  return out;
}

// -- ours -----------------------------------------------------------------------------------

/// " x y z": every repetition, in the order they ran.
std::string listed(const std::vector<double>& v) {
  std::string out;
  for (double x : v)
    out += " " + exact(x, 4);
  return out;
}

} // namespace

std::vector<std::string> linear_keys(const std::string& mode, const train_bench_options& o) {
  return {"mode=" + mode,
          "model=linear_bias",
          "data=per_worker_linear",
          "synthetic_examples=2",
          "synthetic_features=" + std::to_string(linear_features),
          "seed=" + std::to_string(linear_seed),
          "batch_size=1",
          "steps=100000000",
          "optimizer=sgd",
          "learning_rate=" + exact(linear_lr),
          "log_every=100",
          "eval_every=0",
          "warmup_secs=" + exact(o.warmup_s),
          "window_secs=" + exact(o.window_s)};
}

namespace {

/// The steps/s of one timed run of ours on shared memory or TCP; `loss`
/// gets the chief's last reported training loss, `cpu_ms` (if given) the
/// CPU of all its processes over the whole run per global step.
std::optional<double> ours_linear(const std::vector<std::string>& keys, bool shm,
                                  const train_bench_options& o, const scratch_dir& dir,
                                  const std::string& tag, std::string& failure, double& loss,
                                  std::vector<double>* cpu_ms = nullptr,
                                  std::vector<std::string>* ps_choices = nullptr) {
  scoped_shm plane{shm};
  auto run = run_cluster(keys, o, dir, tag);
  auto x = steps_per_s(run, failure);
  if (x && run.done.count("window_steps") == 0) {
    failure = "the chief's `train done:` line has no window_steps (an actorflow-train without "
              "window_secs?)";
    return std::nullopt;
  }
  if (x && run.window == "not_measured") {
    failure = "the window was not measured: " + run.window_why;
    return std::nullopt;
  }
  if (x && *x <= 0) {
    failure = "the job ended before its timed window did";
    return std::nullopt;
  }
  loss = run.done.count("loss") ? run.done["loss"] : -1;
  if (x && ps_choices)
    ps_choices->push_back(run.ps_choice.empty() ? "no choice logged" : run.ps_choice);
  if (x && cpu_ms && run.done["global_step"] > 0)
    cpu_ms->push_back(run.cpu_seconds * 1e3 / run.done["global_step"]);
  return x;
}

/// `# NAME: CPU per step ...`: each side's median CPU per step (all its
/// processes, user and system, over the whole run; kernel threads' work,
/// such as softirqs deferred to ksoftirqd, is in none of them), and the most
/// steps/s this machine's CPUs allow at `raw_cpu_ms` (the raw
/// store-and-forward job's CPU per step) against its `raw_steps_per_s`:
/// where the CPU, not a wait, is the limit, no design that spends as much
/// per step goes faster.
void print_cpu_ceiling(const std::string& name, double raw_steps_per_s, double raw_cpu_ms,
                       const std::vector<std::pair<std::string, std::vector<double>>>& sides) {
  std::string line = "# " + name + ": CPU per step (the ps and both workers, user and system, "
                     "the whole run; medians):";
  const char* sep = " ";
  for (const auto& [label, ms] : sides) {
    if (ms.empty())
      continue;
    line += sep + label + " " + exact(median(ms), 3) + " ms";
    sep = ", ";
  }
  auto cpus = usable_cores();
  if (raw_cpu_ms > 0 && raw_steps_per_s > 0) {
    double ceiling = static_cast<double>(cpus) * 1e3 / raw_cpu_ms;
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  ". This bench's %zu CPUs, busy all the time, allow %.1f steps/s at the raw "
                  "store-and-forward job's CPU per step: %.3f x its figure",
                  cpus, ceiling, ceiling / raw_steps_per_s);
    line += buf;
  }
  std::printf("%s\n", line.c_str());
}

/// The sync 1 M lines, from one set of alternating runs: ours on TCP
/// (store-and-forward, pipelined, pipeline_sync = "auto") and on shared
/// memory, the raw-TCP ps store-and-forward and pipelined (each run only if
/// a wanted line needs it).
void bench_linear_sync(bool tcp_line, bool shm_line, bool shm_vs_tcp, bool piped_line,
                       bool auto_line, const train_bench_options& o, const scratch_dir& dir) {
  auto keys = linear_keys("sync", o);
  auto piped_keys = keys, auto_keys = keys;
  piped_keys.push_back("pipeline_sync=true");
  auto_keys.push_back("pipeline_sync=auto");
  bool need_raw = tcp_line || piped_line || auto_line, need_tcp = tcp_line || shm_vs_tcp;
  bool need_shm = shm_line || shm_vs_tcp;
  std::vector<double> tcp, shm, store, piped, raw_shm, ours_piped, ours_auto;
  std::vector<double> cpu_tcp, cpu_piped, cpu_auto, cpu_store, cpu_raw_piped; // ms per step
  std::string tcp_failure, shm_failure, piped_failure, auto_failure;
  std::vector<std::string> auto_choices; // the kind ps 0 kept last, per rep
  double tcp_loss = -1, shm_loss = -1, piped_loss = -1, auto_loss = -1;
  raw_run last_raw, last_raw_shm;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (need_raw)
      if (auto b = raw_training("sync", true, o, dir)) {
        store.push_back(b->steps_per_s);
        if (b->cpu_ms_per_step)
          cpu_store.push_back(*b->cpu_ms_per_step);
        last_raw = *b;
      }
    if (need_tcp && tcp_failure.empty())
      if (auto x = ours_linear(keys, false, o, dir, "sync-tcp", tcp_failure, tcp_loss, &cpu_tcp))
        tcp.push_back(*x);
    if (piped_line && piped_failure.empty())
      if (auto x = ours_linear(piped_keys, false, o, dir, "sync-tcp-piped", piped_failure,
                               piped_loss, &cpu_piped))
        ours_piped.push_back(*x);
    if (auto_line && auto_failure.empty())
      if (auto x = ours_linear(auto_keys, false, o, dir, "sync-tcp-auto", auto_failure,
                               auto_loss, &cpu_auto, &auto_choices))
        ours_auto.push_back(*x);
    if (tcp_line || piped_line)
      if (auto b = raw_training("sync", false, o, dir)) {
        piped.push_back(b->steps_per_s);
        if (b->cpu_ms_per_step)
          cpu_raw_piped.push_back(*b->cpu_ms_per_step);
      }
    if (need_shm && shm_failure.empty())
      if (auto x = ours_linear(keys, true, o, dir, "sync-shm", shm_failure, shm_loss))
        shm.push_back(*x);
    if (shm_line)
      if (auto b = raw_shm_training(o, dir)) {
        raw_shm.push_back(b->steps_per_s);
        last_raw_shm = *b;
      }
  }
  std::printf("# train_sync_1m_2w: final loss (x.w + b - y)^2: raw TCP workers %.3g and %.3g, raw "
              "shared-memory workers %.3g and %.3g; ours (the chief's last report) %.3g on TCP, "
              "%.3g on shared memory (0 0 or -1: not run)\n",
              last_raw.loss[0], last_raw.loss[1], last_raw_shm.loss[0], last_raw_shm.loss[1],
              tcp_loss, shm_loss);
  if (tcp_line) {
    std::printf("# train_sync_1m_2w_tcp: actorflow over TCP (ACTORFLOW_DATA_SHM=off) against the "
                "raw-TCP store-and-forward ps\n");
    report("train_sync_1m_2w_tcp", tcp, store, "steps/s", tcp_failure);
    if (!piped.empty() && !store.empty())
      std::printf("# train_sync_1m_2w_tcp: the raw-TCP pipelined ps (chunk by chunk): %.3f "
                  "steps/s, %.3f x the store-and-forward ps; ours %.3f x the pipelined ps; "
                  "reps:%s\n",
                  median(piped), median(piped) / median(store),
                  tcp.empty() ? 0.0 : median(tcp) / median(piped), listed(piped).c_str());
  }
  if ((tcp_line || piped_line || auto_line) && !store.empty())
    print_cpu_ceiling(tcp_line     ? "train_sync_1m_2w_tcp"
                      : piped_line ? "train_sync_1m_2w_tcp_pipelined"
                                   : "train_sync_1m_2w_tcp_auto",
                      median(store), median(cpu_store), {{"ours", cpu_tcp},
                                      {"ours pipelined", cpu_piped},
                                      {"ours auto", cpu_auto},
                                      {"raw store-and-forward", cpu_store},
                                      {"raw pipelined", cpu_raw_piped}});
  if (piped_line) {
    std::printf("# train_sync_1m_2w_tcp_pipelined: actorflow over TCP with pipeline_sync "
                "(ACTORFLOW_DATA_SHM=off; final loss %.3g) against the raw-TCP store-and-forward "
                "ps (target >= 1.2)\n",
                piped_loss);
    report("train_sync_1m_2w_tcp_pipelined", ours_piped, store, "steps/s", piped_failure);
    if (!piped.empty() && !store.empty())
      std::printf("# train_sync_1m_2w_tcp_pipelined: the raw-TCP pipelined ps: %.3f steps/s, "
                  "%.3f x the store-and-forward ps; ours pipelined %.3f x it; reps:%s\n",
                  median(piped), median(piped) / median(store),
                  ours_piped.empty() ? 0.0 : median(ours_piped) / median(piped),
                  listed(piped).c_str());
  }
  if (auto_line) {
    std::printf("# train_sync_1m_2w_tcp_auto: actorflow over TCP with pipeline_sync = \"auto\" "
                "(the aggregator times both kinds of round and keeps the faster; "
                "ACTORFLOW_DATA_SHM=off; final loss %.3g) against the raw-TCP store-and-forward "
                "ps (target >= 1.2)\n",
                auto_loss);
    for (size_t rep = 0; rep < auto_choices.size(); ++rep)
      std::printf("# train_sync_1m_2w_tcp_auto rep %zu: the ps kept %s\n", rep + 1,
                  auto_choices[rep].c_str());
    report("train_sync_1m_2w_tcp_auto", ours_auto, store, "steps/s", auto_failure);
  }
  if (shm_line) {
    std::printf("# train_sync_1m_2w_shm: actorflow over shared memory against the raw "
                "shared-memory store-and-forward ps (a pair of regions per worker, futex "
                "wake-ups)\n");
    report("train_sync_1m_2w_shm", shm, raw_shm, "steps/s", shm_failure);
  }
  if (shm_vs_tcp) {
    std::printf("# train_sync_1m_2w_shm_vs_tcp: actorflow over shared memory against actorflow "
                "over TCP, the same job (target >= 1.5)\n");
    report("train_sync_1m_2w_shm_vs_tcp", shm, tcp, "steps/s",
           !shm_failure.empty() ? shm_failure : tcp_failure.empty() ? "" : "TCP: " + tcp_failure);
  }
}

/// train_sync_1m_2w_tcp_bf16 ([train] wire_dtype = "bf16"): the sync 1 M job
/// over TCP with its gradients and parameters in bf16 against the same job in
/// float32, alternating, with both final losses; then the digits MLP over TCP
/// both ways, for its held-out accuracy (docs/training.md "bf16 on the wire").
void bench_linear_bf16(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_sync_1m_2w_tcp_bf16";
  auto keys = linear_keys("sync", o);
  auto bf16_keys = keys;
  bf16_keys.push_back("wire_dtype=bf16");
  std::vector<double> f32, bf16;
  std::string failure, f32_failure;
  double f32_loss = -1, bf16_loss = -1;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (f32_failure.empty())
      if (auto x = ours_linear(keys, false, o, dir, "sync-tcp-f32", f32_failure, f32_loss))
        f32.push_back(*x);
    if (failure.empty())
      if (auto x = ours_linear(bf16_keys, false, o, dir, "sync-tcp-bf16", failure, bf16_loss))
        bf16.push_back(*x);
  }
  std::printf("# %s: actorflow over TCP (ACTORFLOW_DATA_SHM=off) with wire_dtype = \"bf16\" "
              "against the same job in float32 (train_sync_1m_2w_tcp's side), this run; final "
              "loss (the chief's last report) %.3g in bf16, %.3g in float32\n",
              name.c_str(), bf16_loss, f32_loss);
  report(name, bf16, f32, "steps/s",
         !failure.empty() ? failure : f32_failure.empty() ? "" : "float32: " + f32_failure);
  std::vector<std::string> digits{"mode=sync",     "model=mlp",     "hidden=[128]", "data=digits",
                                  "batch_size=32", "steps=" + std::to_string(o.digits_steps),
                                  "log_every=0",   "eval_every=0"};
  scoped_shm plane{false};
  double acc[2] = {-1, -1}, examples[2] = {-1, -1};
  for (int b = 0; b < 2; ++b) {
    auto k = digits;
    if (b == 1)
      k.push_back("wire_dtype=bf16");
    auto run = run_cluster(k, o, dir, b == 1 ? "digits-tcp-bf16" : "digits-tcp-f32");
    if (run.failure.empty()) {
      acc[b] = run.accuracy;
      examples[b] = run.done.count("examples_per_s") ? run.done["examples_per_s"] : -1;
    } else {
      std::fprintf(stderr, "actorflow-bench: %s digits (%s): %s\n", name.c_str(),
                   b == 1 ? "bf16" : "float32", run.failure.c_str());
    }
  }
  std::printf("# %s: the digits MLP over TCP, %lu steps, one run each: held-out accuracy %.4f in "
              "bf16, %.4f in float32; %.0f and %.0f examples/s (-1: failed)\n",
              name.c_str(), static_cast<unsigned long>(o.digits_steps), acc[1], acc[0],
              examples[1], examples[0]);
}

/// train_async_1m_2w_tcp(_pipelined): every push is a global step (the sum
/// of both workers' steps), ours over TCP (store-and-forward, and with
/// pipeline_async) against the raw-TCP store-and-forward ps.
void bench_linear_async(bool tcp_line, bool piped_line, const train_bench_options& o,
                        const scratch_dir& dir) {
  const std::string name = "train_async_1m_2w_tcp", piped_name = name + "_pipelined";
  auto keys = linear_keys("async", o);
  auto piped_keys = keys;
  piped_keys.push_back("pipeline_async=true");
  std::vector<double> ours, ours_piped, store, piped;
  std::string failure, piped_failure;
  double loss = -1, piped_loss = -1;
  raw_run last_raw;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (auto b = raw_training("async", true, o, dir)) {
      store.push_back(b->steps_per_s);
      last_raw = *b;
    }
    if (tcp_line && failure.empty())
      if (auto x = ours_linear(keys, false, o, dir, "async-tcp", failure, loss))
        ours.push_back(*x);
    if (piped_line && piped_failure.empty())
      if (auto x = ours_linear(piped_keys, false, o, dir, "async-tcp-piped", piped_failure,
                               piped_loss))
        ours_piped.push_back(*x);
    if (auto b = raw_training("async", false, o, dir))
      piped.push_back(b->steps_per_s);
  }
  std::printf("# %s: final loss: raw workers %.3g and %.3g; ours (the chief's last report) "
              "%.3g store-and-forward, %.3g pipelined (-1: not run)\n",
              name.c_str(), last_raw.loss[0], last_raw.loss[1], loss, piped_loss);
  auto lines = [&](const std::string& line, const char* how, const std::vector<double>& x,
                   const std::string& why) {
    std::printf("# %s: actorflow over TCP%s (ACTORFLOW_DATA_SHM=off) against the raw-TCP "
                "store-and-forward ps\n",
                line.c_str(), how);
    report(line, x, store, "steps/s", why);
    if (!piped.empty() && !store.empty())
      std::printf("# %s: the raw-TCP pipelined ps: %.3f steps/s, %.3f x the store-and-forward "
                  "ps; ours %.3f x the pipelined ps; reps:%s\n",
                  line.c_str(), median(piped), median(piped) / median(store),
                  x.empty() ? 0.0 : median(x) / median(piped), listed(piped).c_str());
  };
  if (tcp_line)
    lines(name, "", ours, failure);
  if (piped_line)
    lines(piped_name, " with pipeline_async", ours_piped, piped_failure);
}

/// Sync with a straggler, over TCP: 3 worker processes, one sleeping 3
/// steps' time in each of its steps (4x slower), replicas_to_aggregate = 2,
/// against 2 workers and no straggler (every gradient). Backup workers should
/// make the straggler cost nothing: the steps go at the speed of the other two.
/// Its sleep (--step-delay-ms) comes before its compute, so a step that
/// closed meanwhile costs it neither compute nor send; a straggler slow in
/// its compute itself would skip only the send.
void bench_straggler(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_sync_1m_3w_1slow_tcp";
  auto keys = linear_keys("sync", o);
  scoped_shm plane{false};
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
      with_backup.push_back("synthetic_examples=3"); // one example per worker
      auto run = run_cluster(with_backup, o, dir, name, 1, 3,
                             {{2, {"--step-delay-ms", std::to_string(std::max(1, step_ms))}}});
      if (auto x = steps_per_s(run, failure))
        ours.push_back(*x);
    }
  }
  std::printf("# %s: both sides actorflow over TCP (ACTORFLOW_DATA_SHM=off), the 1 M workload's "
              "timed window; the straggler sleeps (--step-delay-ms) before computing, so a step "
              "that closed meanwhile costs it neither compute nor send (one slow in its compute "
              "would skip only the send)\n", name.c_str());
  report(name, ours, base, "steps/s", failure);
}

/// The digits lines, from one set of alternating runs: the sync 2-worker
/// digits MLP over TCP and over shared memory against one process, and
/// against each other; held-out accuracies beside.
void bench_digits(bool tcp_line, bool shm_line, bool shm_vs_tcp, const train_bench_options& o,
                  const scratch_dir& dir) {
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
    std::printf("metric train_digits_examples_per_s_tcp skipped: the digits: %s\n",
                data.error().what.c_str());
    return;
  }
  bool need_tcp = tcp_line || shm_vs_tcp, need_shm = shm_line || shm_vs_tcp;
  std::vector<double> tcp, shm, local, tcp_acc, shm_acc, local_acc;
  std::string tcp_failure, shm_failure;
  auto ours = [&](bool on_shm, std::vector<double>& out, std::vector<double>& acc,
                  std::string& failure) {
    scoped_shm plane{on_shm};
    auto run = run_cluster(keys, o, dir, on_shm ? "digits-shm" : "digits-tcp");
    if (!run.failure.empty())
      failure = run.failure;
    else if (!run.done.count("examples_per_s"))
      failure = "no examples_per_s in the chief's `train done:` line";
    else
      out.push_back(run.done["examples_per_s"]), acc.push_back(run.accuracy);
  };
  for (int rep = 0; rep < o.reps; ++rep) {
    // the same examples in one process: one batch of 64 per global step
    if (tcp_line || shm_line) {
      if (auto l = train::train_local(c, *data, o.digits_steps, 64))
        local.push_back(l->examples_per_s), local_acc.push_back(l->accuracy);
      else
        std::fprintf(stderr, "actorflow-bench: local digits training: %s\n",
                     l.error().what.c_str());
    }
    if (need_tcp && tcp_failure.empty())
      ours(false, tcp, tcp_acc, tcp_failure);
    if (need_shm && shm_failure.empty())
      ours(true, shm, shm_acc, shm_failure);
  }
  auto acc = [](const std::vector<double>& v) { return v.empty() ? -1.0 : median(v); };
  std::printf("# train_digits: held-out accuracy (median): ours %.4f over TCP, %.4f over shared "
              "memory, one process %.4f (-1: not run)\n",
              acc(tcp_acc), acc(shm_acc), acc(local_acc));
  if (tcp_line) {
    std::printf("# train_digits_examples_per_s_tcp: actorflow over TCP (ACTORFLOW_DATA_SHM=off) "
                "against the same steps in one process (no transport)\n");
    report("train_digits_examples_per_s_tcp", tcp, local, "examples/s", tcp_failure);
  }
  if (shm_line) {
    std::printf("# train_digits_examples_per_s_shm: actorflow over shared memory against the "
                "same steps in one process (no transport)\n");
    report("train_digits_examples_per_s_shm", shm, local, "examples/s", shm_failure);
  }
  if (shm_vs_tcp) {
    std::printf("# train_digits_shm_vs_tcp: actorflow over shared memory against actorflow over "
                "TCP, the same job (target >= 1.0)\n");
    report("train_digits_shm_vs_tcp", shm, tcp, "examples/s",
           !shm_failure.empty() ? shm_failure : tcp_failure.empty() ? "" : "TCP: " + tcp_failure);
  }
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
  std::printf("# %s: both sides on shared memory (the default between processes of one host)\n",
              name.c_str());

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
    std::vector<std::string> v{"train_sync_1m_2w_tcp", "train_sync_1m_2w_tcp_pipelined",
                               "train_sync_1m_2w_tcp_auto",
                               "train_async_1m_2w_tcp", "train_async_1m_2w_tcp_pipelined",
                               "train_sync_1m_2w_shm",
                               "train_sync_1m_2w_shm_vs_tcp", "train_sync_1m_2w_tcp_bf16"};
    for (auto& m : allreduce_metrics()) // bench/allreduce_bench.cpp
      v.push_back(m);
    for (auto m : {"train_digits_examples_per_s_tcp", "train_digits_examples_per_s_shm",
                   "train_digits_shm_vs_tcp", "train_sync_partitioned_3ps",
                   "train_sync_1m_3w_1slow_tcp"})
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
              "with the baseline; 1m: the 1 M workload (docs/training.md), %.3g s warm-up then "
              "a %.3g s window; digits: %lu steps\n",
              opts.reps, opts.warmup_s, opts.window_s,
              static_cast<unsigned long>(opts.digits_steps));
  std::fflush(stdout);
  bool sync_tcp = want("train_sync_1m_2w_tcp"), sync_shm = want("train_sync_1m_2w_shm");
  bool sync_ratio = want("train_sync_1m_2w_shm_vs_tcp");
  bool sync_piped = want("train_sync_1m_2w_tcp_pipelined");
  bool sync_auto = want("train_sync_1m_2w_tcp_auto");
  if (sync_tcp || sync_shm || sync_ratio || sync_piped || sync_auto)
    bench_linear_sync(sync_tcp, sync_shm, sync_ratio, sync_piped, sync_auto, opts, dir);
  if (want("train_sync_1m_2w_tcp_bf16"))
    bench_linear_bf16(opts, dir);
  bool async_tcp = want("train_async_1m_2w_tcp");
  bool async_piped = want("train_async_1m_2w_tcp_pipelined");
  if (async_tcp || async_piped)
    bench_linear_async(async_tcp, async_piped, opts, dir);
  run_allreduce_benches(wanted, opts); // those of allreduce_metrics() in `wanted`
  bool digits_tcp = want("train_digits_examples_per_s_tcp");
  bool digits_shm = want("train_digits_examples_per_s_shm");
  bool digits_ratio = want("train_digits_shm_vs_tcp");
  if (digits_tcp || digits_shm || digits_ratio)
    bench_digits(digits_tcp, digits_shm, digits_ratio, opts, dir);
  if (want("train_sync_partitioned_3ps"))
    bench_partitioned(opts, dir);
  if (want("train_sync_1m_3w_1slow_tcp"))
    bench_straggler(opts, dir);
}

} // namespace af::bench
