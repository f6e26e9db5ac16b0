// train_embed_10m_2w (embed_benches.hpp): sparse training of a 10,000,000 x
// 64 table over 3 shards by 2 workers of 512 uniform ids, sync and async:
// actorflow-train's sparse job (3 ps + 2 worker processes on TCP) against the
// raw-TCP ps (embed_raw.hpp), alternating, medians of 3 reps.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "bench/bench_train.hpp"
#include "bench/embed_benches.hpp"
#include "bench/embed_raw.hpp"
#include "bench/embed_raw_model.hpp"
#include "bench/proc_stats.hpp"
#include "bench/train_common.hpp"
#include "bench/train_run.hpp"
#include "config/loopback.hpp"

namespace af::bench::embed_detail {

namespace {

using namespace train_run;

const char* const metric = "train_embed_10m_2w";
constexpr int64_t table_rows = 10000000, dim = 64, batch = 512;
constexpr int shards = 3, workers = 2, reps = 3;
constexpr double warmup_s = 1, window_s = 4;
constexpr int log_every = 10; ///< the sparse job's progress lines: its window's ticks
constexpr int64_t examples = 262144; ///< the synthetic clicks of both sides' model
/// The raw shards' rows: embed_value scaled to a model's size (exact in float32).
constexpr double value_scale = 1.0 / (1 << 20);

/// What one run of the raw job gave.
struct raw_train_run {
  double steps_per_s = 0;      ///< sync: steps of the pair; async: both workers' steps
  double bytes_per_step = 0;   ///< at the workers' sockets, per worker step
  double touched_per_step = 0; ///< the distinct ids and their rows, out and back, per worker step
  double loss = 0;             ///< with the model: worker 0's last step's
};

/// Two raw workers against the shard servers on `ports`, one timed window
/// (run `run`: the shards tell runs apart), or nothing (why on stderr).
/// Their ids are the batches of the sparse job of seed `job_seed` (its
/// clicks in its order). `model`: the workers run the job's model step
/// (embed_raw_model.hpp: the line's baseline); else their rows scaled are
/// the gradient (the transport alone, on the same rows).
std::optional<raw_train_run> raw_job(const std::vector<uint16_t>& ports, bool sync, uint64_t run,
                                     uint64_t job_seed, bool model, const scratch_dir& dir) {
  std::string list;
  for (auto p : ports)
    list += (list.empty() ? "" : ",") + std::to_string(p);
  std::vector<child_process> kids;
  std::vector<std::string> names;
  for (int r = 0; r < workers; ++r) {
    std::vector<std::string> argv{self_exe(), helper_flag, "embed-worker", "ports=" + list,
                                  "rows=" + std::to_string(table_rows),
                                  "dim=" + std::to_string(dim), "batch=" + std::to_string(batch),
                                  "mode=" + std::string{sync ? "sync" : "async"},
                                  "warmup=" + exact(warmup_s), "window=" + exact(window_s)};
    for (auto& w : raw_train_worker_args(r, run, job_seed, model, examples))
      argv.push_back(std::move(w));
    kids.push_back(spawn(argv, dir.path / ("embed-worker" + std::to_string(r) + ".log")));
    names.push_back("raw embed worker " + std::to_string(r));
  }
  if (auto failure = wait_all(kids, names, clock_type::now() + std::chrono::seconds(60))) {
    std::fprintf(stderr, "actorflow-bench: %s: %s: %s\n", metric, names[failure->who].c_str(),
                 failure->why.c_str());
    return std::nullopt;
  }
  raw_train_run out;
  double rates[workers] = {};
  for (int r = 0; r < workers; ++r) {
    auto v = parse_values(slurp(dir.path / ("embed-worker" + std::to_string(r) + ".log")));
    if (v["window_seconds"] <= 0 || v["window_steps"] <= 0)
      return std::nullopt;
    double rate = rates[r] = v["window_steps"] / v["window_seconds"];
    // sync: the pair steps together, a step is one of each; async: every
    // worker's step is a global step
    out.steps_per_s += sync ? rate / workers : rate;
    out.bytes_per_step += v["window_bytes"] / v["window_steps"] / workers;
    out.touched_per_step += 2 * v["unique_mean"] * (8 + dim * 4) / workers;
    if (r == 0)
      out.loss = v["loss"];
  }
  // In step (the barrier works), a sync pair's workers step equally often.
  if (sync && std::abs(rates[0] - rates[1]) > 0.1 * std::max(rates[0], rates[1])) {
    std::fprintf(stderr, "actorflow-bench: %s: sync workers at %.0f and %.0f steps/s: not in step\n",
                 metric, rates[0], rates[1]);
    return std::nullopt;
  }
  return out;
}

/// What one run of the sparse job gave, beside raw_train_run's fields.
struct ours_train_run {
  raw_train_run r;
  std::vector<double> ps_rss_mib; ///< each ps's VmRSS at the window's end
};

/// The config of a run of the sparse job: the cluster on `ports` (3 ps, then
/// 2 workers) and the recommender at the raw table's size: users x (dim + 1)
/// = 10,000,000 x 64 float32 (the user table; the item table's 3 rows are
/// noise beside it), uniform ids (zipf = 0, as the raw workers' ids=uniform),
/// batches of 512, SGD. Steps enough to outlast the window: the run is
/// stopped once the window is measured.
std::filesystem::path write_job_config(const std::vector<uint16_t>& ports, bool sync,
                                       uint64_t run, const scratch_dir& dir) {
  auto path = dir.path / ("sparse-job" + std::to_string(run) + ".toml");
  std::ofstream out{path};
  out << "[cluster]\nps = [";
  for (int k = 0; k < shards; ++k)
    out << (k ? ", " : "") << "\"127.0.0.1:" << ports[k] << "\"";
  out << "]\nworker = [";
  for (int w = 0; w < workers; ++w)
    out << (w ? ", " : "") << "\"127.0.0.1:" << ports[shards + w] << "\"";
  out << "]\n\n[train]\nmode = \"" << (sync ? "sync" : "async") << "\"\n"
      << "model = \"recommender\"\nusers = " << table_rows << "\nitems = 3\ndim = " << dim - 1
      << "\nzipf = 0\npartition_strategy = \"mod\"\ndata = \"synthetic\"\n"
      << "synthetic_examples = " << examples << "\nholdout = 0.2\nbatch_size = " << batch
      << "\nsteps = 100000000\noptimizer = \"sgd\"\nlearning_rate = 0.1\nseed = " << run
      << "\nlog_every = " << log_every
      // its check counts two optimizer slots (Adam) in one process: SGD has none,
      // and the tables are cut over 3 ps
      << "\nmax_data_bytes = 12000000000\n";
  return path;
}

/// The chief's last progress line in `log` (`step G/T: loss L`): G, or 0.
uint64_t last_global_step(const std::string& log) {
  auto at = log.rfind("\nstep ");
  if (at == std::string::npos)
    return 0;
  return std::strtoull(log.c_str() + at + 6, nullptr, 10);
}

/// actorflow's side of the line: the sparse job (docs/sparse.md, "The sparse
/// job"), 3 ps and 2 workers of actorflow-train on TCP (ACTORFLOW_DATA_SHM=off)
/// with the same table, batch and ids. The job has no timed window of its
/// own, so the bench takes one from the chief's progress lines (every
/// log_every global steps), timestamped as they appear in its log: the
/// first line `warmup_s` after the first one opens the window, the first
/// `window_s` later closes it; steps/s = global steps over that time (sync:
/// the pair's steps; async: every worker's, as the baseline counts them).
/// Bytes: socket_bytes_of the ps pids at both ends, per worker step. Then
/// the ps's VmRSS, and the job is stopped. Nothing (with `why`) if it failed.
std::optional<ours_train_run> ours_job(bool sync, uint64_t run, const scratch_dir& dir,
                                       std::string& why) {
  auto bin = std::filesystem::path{self_exe()}.parent_path() / "actorflow-train";
  if (!std::filesystem::exists(bin))
    return why = "not measured: " + bin.string() + " not found", std::nullopt;
  std::vector<uint16_t> ports;
  for (int i = 0; i < shards + workers; ++i)
    ports.push_back(free_loopback_port());
  auto config = write_job_config(ports, sync, run, dir);
  std::vector<child_process> kids;
  std::vector<pid_t> ps_pids;
  std::vector<std::filesystem::path> logs;
  for (int i = 0; i < shards + workers; ++i) {
    bool ps = i < shards;
    int task = ps ? i : i - shards;
    logs.push_back(dir.path / ("sparse-job" + std::to_string(run) + (ps ? "-ps" : "-worker")
                               + std::to_string(task) + ".log"));
    kids.push_back(spawn({bin.string(), "--config", config.string(), "--job", ps ? "ps" : "worker",
                          "--task", std::to_string(task)},
                         logs.back()));
    if (ps)
      ps_pids.push_back(kids.back().pid());
  }
  const auto& chief_log = logs[shards];
  using secs = std::chrono::duration<double>;
  auto deadline = clock_type::now() + std::chrono::seconds(300); // 2.56 GB to fill first
  clock_type::time_point first{}, t0{};
  uint64_t g_seen = 0, g0 = 0, bytes0 = 0;
  std::optional<ours_train_run> out;
  while (!out) {
    for (size_t i = 0; i < kids.size(); ++i)
      if (auto st = kids[i].try_wait())
        return why = "failed: " + logs[i].filename().string() + " "
                     + child_process::describe(*st) + ": " + last_line(slurp(logs[i])),
               std::nullopt;
    if (clock_type::now() > deadline)
      return why = "failed: no window within 300 s: " + last_line(slurp(chief_log)), std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5)); // the log's poll
    uint64_t g = last_global_step(slurp(chief_log));
    if (g == g_seen)
      continue;
    g_seen = g;
    auto now = clock_type::now();
    if (first == clock_type::time_point{}) {
      first = now;
    } else if (t0 == clock_type::time_point{}) {
      if (secs(now - first).count() >= warmup_s) {
        auto b = socket_bytes_of(ps_pids);
        if (!b)
          return why = "not measured: `ss` cannot be run", std::nullopt;
        t0 = now, g0 = g, bytes0 = *b;
      }
    } else if (secs(now - t0).count() >= window_s) {
      auto b = socket_bytes_of(ps_pids);
      ours_train_run o;
      double global = static_cast<double>(g - g0);
      double worker_steps = sync ? global * workers : global;
      o.r.steps_per_s = global / secs(now - t0).count();
      o.r.bytes_per_step = static_cast<double>(b.value_or(bytes0) - bytes0) / worker_steps;
      for (pid_t p : ps_pids)
        o.ps_rss_mib.push_back(proc_kib(p, "VmRSS") / 1024.0);
      out = std::move(o);
    }
  }
  for (auto& k : kids)
    k.signal(SIGKILL); // done measuring: its end (evaluation, shutdown) is not timed
  return out;
}

/// What an ideal exchange of the sparse job moves a worker step: each
/// touched row and its id, out and back. A batch of 512 uniform users among
/// 10 M has 512 distinct ones but for 0.013 on average; its 3 items (all of
/// them) and the global bias (one float at ps 0) are the rest.
double ours_touched_per_step() {
  double users = batch - double(batch) * (batch - 1) / 2 / double(table_rows);
  return 2 * (users + 3) * (8 + dim * 4) + 2 * (8 + 4);
}

} // namespace

int train_bench() {
  scratch_dir dir;
  // The shard servers live across the runs (filling 2.56 GB once); each
  // run's workers connect as a run of their own.
  std::vector<child_process> servers;
  std::vector<uint16_t> ports;
  for (int k = 0; k < shards; ++k) {
    uint16_t port = 0;
    int lfd = listen_on_loopback(port, 16);
    if (lfd < 0)
      return std::cerr << "actorflow-bench: " << metric << ": no port" << std::endl, 1;
    servers.push_back(spawn({self_exe(), helper_flag, "embed-shard",
                             "listen-fd=" + std::to_string(lfd), "shard=" + std::to_string(k),
                             "shards=" + std::to_string(shards),
                             "rows=" + std::to_string(table_rows), "dim=" + std::to_string(dim),
                             "lr=0.1", "scale=" + exact(value_scale)},
                            dir.path / ("embed-shard" + std::to_string(k) + ".log"), lfd));
    close(lfd);
    ports.push_back(port);
  }
  std::vector<double> ours[2], base[2], bytes[2], touched[2], ours_bytes[2];
  std::vector<double> transport[2], raw_loss[2]; // the raw ps without the model
  std::vector<double> ours_rss[2];
  std::string why[2];
  uint64_t run = 0;
  bool failed = false;
  scoped_shm tcp{false}; // the sparse job's data plane on TCP, as the raw ps's
  // Alternating: ours, then the baseline, each mode, each rep. The raw
  // shards idle (2.56 GB) while the job's ps hold theirs: 5.2 GB in all.
  for (int rep = 0; rep < reps && !failed; ++rep)
    for (int mode = 0; mode < 2 && !failed; ++mode) { // 0: sync, 1: async
      std::string w;
      const uint64_t job_seed = ++run; // the job's seed: its clicks, which both raw runs read
      if (auto o = ours_job(mode == 0, job_seed, dir, w)) {
        ours[mode].push_back(o->r.steps_per_s);
        ours_bytes[mode].push_back(o->r.bytes_per_step);
        ours_rss[mode] = o->ps_rss_mib;
      } else {
        why[mode] = w; // the line's reason if no rep measured
        std::fprintf(stderr, "actorflow-bench: %s: sparse job: %s\n", metric, w.c_str());
      }
      auto b = raw_job(ports, mode == 0, ++run, job_seed, true, dir);
      auto t = b ? raw_job(ports, mode == 0, ++run, job_seed, false, dir) : std::nullopt;
      if (!b || !t) {
        failed = true;
        break;
      }
      base[mode].push_back(b->steps_per_s);
      bytes[mode].push_back(b->bytes_per_step);
      touched[mode].push_back(b->touched_per_step);
      raw_loss[mode].push_back(b->loss);
      transport[mode].push_back(t->steps_per_s);
    }
  // The pushes landed: of rows 0..999 some changed (about 21 of them are
  // users of the clicks, each touched every data epoch of a run).
  if (!failed) {
    raw_embed_client check;
    std::vector<float> rows;
    std::vector<int64_t> first(1000);
    for (size_t i = 0; i < first.size(); ++i)
      first[i] = static_cast<int64_t>(i);
    check.connect(ports, table_rows, dim);
    check.route(first);
    size_t changed = 0;
    if (check.gather(0)) {
      check.assemble(rows);
      for (int64_t i = 0; i < 1000; ++i)
        changed += rows[static_cast<size_t>(i * dim + 1)]
                   != static_cast<float>(value_scale * embed_value(i, 1, dim));
    }
    if (changed == 0) {
      std::fprintf(stderr, "actorflow-bench: %s: none of the raw shards' rows 0..999 changed\n",
                   metric);
      failed = true;
    }
  }
  for (int mode = 0; mode < 2; ++mode)
    if (!ours[mode].empty())
      why[mode].clear(); // a failed rep said so on stderr; the others stand
  std::vector<pid_t> pids;
  for (auto& s : servers)
    pids.push_back(s.pid());
  const double shard_mib = double(table_rows / shards * dim * 4) / 1048576.0;
  // The clicks' training examples name uniform users: the distinct ones,
  // the rows a data epoch touches (all three runs touch only these).
  const double train_examples = 0.8 * static_cast<double>(examples);
  const double epoch_rows = static_cast<double>(table_rows)
                            * -std::expm1(-train_examples / static_cast<double>(table_rows));
  std::printf("# %s: %lld x %lld float32 table (mod, 3 shards), 2 workers of %lld ids a step: "
              "the users of the sparse job's synthetic clicks (%lld examples, a fifth held "
              "out, uniform users: about %.0f distinct rows, %.0f MiB, touched again every "
              "data epoch of %.0f global steps), the same batches on both sides; both sides' "
              "tables advised huge pages (core/tensor.cpp; the raw shard's by hand), ours' rows "
              "prefetched a few ahead (core/prefetch.hpp); "
              "SGD at the shard, TCP on loopback; timed window %.0f s after %.0f s; sync "
              "steps/s counts the pair's steps, async every worker's. ours: actorflow-train's "
              "sparse job (model recommender, users %lld, dim %lld: the user table is this "
              "table; items 3, a table of 3 rows, negligible), its window taken from the "
              "chief's progress lines (every %d global steps) as they appear; baseline: the "
              "raw-TCP ps (bench/embed_raw.hpp) whose workers run the same data and model "
              "step by hand (bench/embed_raw_model.hpp: the same clicks, "
              "train::recommender::step, the item table and bias kept by the worker); "
              "'transport only': the same raw ps and ids, its workers' rows scaled as their "
              "gradient\n",
              metric, static_cast<long long>(table_rows), static_cast<long long>(dim),
              static_cast<long long>(batch), static_cast<long long>(examples), epoch_rows,
              epoch_rows * dim * 4 / 1048576.0, train_examples / (workers * batch), window_s,
              warmup_s,
              static_cast<long long>(table_rows), static_cast<long long>(dim - 1), log_every);
  print_rss(metric, "raw shard", pids, shard_mib);
  for (int mode = 0; mode < 2; ++mode)
    if (!ours_rss[mode].empty()) {
      std::printf("# %s: sparse job ps (%s, last rep) VmRSS MiB:", metric, mode ? "async" : "sync");
      for (double m : ours_rss[mode])
        std::printf(" %.1f", m);
      std::printf(" (each holds %.1f MiB of its own: its user shard; SGD has no slots)\n",
                  shard_mib);
    }
  const char* modes[2] = {"sync", "async"};
  for (int mode = 0; mode < 2; ++mode) {
    auto name = std::string{metric} + "_" + modes[mode];
    report(name, ours[mode], base[mode], "steps/s", why[mode]);
    if (!transport[mode].empty())
      std::printf("# %s transport only (raw workers without the model): %.1f steps/s; ours / "
                  "it %.3f; the raw model's last loss %.4f (log 2 = 0.6931 at the start)\n",
                  name.c_str(), median(transport[mode]),
                  ours[mode].empty() ? 0.0 : median(ours[mode]) / median(transport[mode]),
                  median(raw_loss[mode]));
    if (!bytes[mode].empty())
      std::printf("# %s bytes per worker step at the baseline's workers' sockets (payload): %.0f; "
                  "touched rows + ids (out and back): %.0f; ratio %.3f\n",
                  name.c_str(), median(bytes[mode]), median(touched[mode]),
                  median(bytes[mode]) / median(touched[mode]));
    if (!ours_bytes[mode].empty())
      std::printf("# %s bytes per worker step at the sparse job's ps sockets (ss: all its TCP "
                  "bytes, framing included): %.0f; touched rows + ids: %.0f; ratio %.3f\n",
                  name.c_str(), median(ours_bytes[mode]), ours_touched_per_step(),
                  median(ours_bytes[mode]) / ours_touched_per_step());
    else
      std::printf("# %s sparse job: %s\n", name.c_str(), why[mode].c_str());
  }
  for (auto& s : servers)
    s.signal(SIGTERM);
  for (auto& s : servers)
    s.wait();
  return failed ? 1 : 0;
}

} // namespace af::bench::embed_detail
