// actorflow-bench: actorflow's figures against the raw socket, in one run.
// Each line: metric NAME ours=X baseline=Y unit=U ratio=Z  (ratio = ours/baseline).
// The ps is a real actorflow-node process; the baseline is a forked process
// speaking plain TCP on loopback. Both run now, on this machine, so compare
// ratios, not absolute values.
// The training metrics (bench_train.hpp) run clusters of actorflow-train
// against raw-TCP parameter servers; the sparse lines (embed_benches.hpp) a
// partitioned table over 3 ps against raw-TCP shard servers. `--only a,b`
// runs some metrics.
// The groups of metrics are in bench/benches.hpp; the soak is its own
// program, actorflow-soak (bench/soak_main.cpp).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/allreduce_bench.hpp"
#include "bench/benches.hpp"
#include "bench/cli_checks.hpp"
#include "bench/embed_benches.hpp"
#include "bench/metrics_benches.hpp"
#include "bench/raw_link.hpp"
#include "config/cluster_spec.hpp"
#include "bench/bench_activation.hpp"
#include "bench/bench_train.hpp"
#include "programs/last_resort.hpp"

namespace {

/// The CPU's model name (lscpu's "Model name") and how many cores we see.
std::string cpu_description() {
  std::ifstream in{"/proc/cpuinfo"};
  std::string line, model = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return model + " x" + std::to_string(std::thread::hardware_concurrency());
}

/// The training lines' options (and the metrics_* lines' scrape interval).
void add_train_options(CLI::App& app, af::bench::train_bench_options& topts, int& train_timeout_s) {
  constexpr long double max_int = std::numeric_limits<int>::max();
  using af::bench::positive_whole;
  app.add_option("--train-reps", topts.reps, "repetitions of each training metric (median)")
    ->check(positive_whole("repetitions", max_int));
  app.add_option("--train-warmup", topts.warmup_s,
                 "seconds of the 1 M lines' warm-up, after both workers started (default 5)")
    ->check(af::bench::number_check({0, false, 3600, false, "a number of seconds in [0, 3600]"}));
  app.add_option("--train-window", topts.window_s,
                 "seconds of the 1 M lines' timed window (default 15)")
    ->check(af::bench::number_check({0, true, 3600, false, "a number of seconds in (0, 3600]"}));
  app.add_option("--train-steps", topts.steps_1m,
                 "sync steps of train_sync_partitioned_3ps per repetition")
    ->check(positive_whole("steps", 1e18));
  app.add_option("--digits-steps", topts.digits_steps, "sync steps of the digits MLP")
    ->check(positive_whole("steps", 1e18));
  app.add_option("--allreduce-rounds", topts.allreduce_rounds,
                 "timed all-reduces per repetition")
    ->check(positive_whole("all-reduces", max_int));
  app.add_option("--train-timeout", train_timeout_s,
                 "seconds one training cluster may run before it is killed")
    ->check(positive_whole("seconds", max_int));
  app.add_option("--train-set", topts.extra_sets,
                 "key=value passed as --set to every actorflow-train process");
  app.add_option("--scrape-ms", topts.scrape_ms,
                 "the metrics_* lines: milliseconds between scrapes of /metrics (default 1000)")
    ->check(positive_whole("milliseconds", max_int));
}

int main_body(int argc, char** argv) {
  // The training metrics' helper processes are this binary, re-executed.
  if (int rc = af::bench::run_allreduce_helper(argc, argv); rc >= 0)
    return rc;
  if (int rc = af::bench::run_embed_helper(argc, argv); rc >= 0)
    return rc;
  if (int rc = af::bench::run_helper(argc, argv); rc >= 0)
    return rc;
  CLI::App app{"actorflow-bench: actorflow against the raw socket, measured in the same run"};
  const std::vector<std::string> core_metrics{
    "remote_assign_add_rtt", "tensor_64mib_assign", "tensor_64mib_read",  "fanin_8x4mib",
    "node_rss_64mib",        "local_read_rtt",      "gemm_2048_cpu",      "nonfinite_check_1m",
    "gemm_4096_gpu",         "elementwise_gpu"};
  const std::vector<std::string> tls_metrics{"tensor_64mib_assign_tls", "remote_assign_add_rtt_tls",
                                             "event_loop_prototype"};
  const std::vector<std::string> local_metrics{"remote_assign_add_rtt_local",
                                               "remote_assign_add_rtt_channel_tcp",
                                               "tensor_64mib_assign_local", "tensor_64mib_read_local",
                                               "tensor_64mib_assign_ucx", "remote_assign_add_rtt_ucx"};
  std::vector<std::string> all_metrics = core_metrics;
  for (auto& m : tls_metrics)
    all_metrics.push_back(m);
  for (auto& m : local_metrics)
    all_metrics.push_back(m);
  const std::string activation_metric = "model_parallel_64mib_activation";
  all_metrics.push_back(activation_metric);
  const std::vector<std::string> send_metrics{"tcp_4mib_send_zerocopy", "tcp_4mib_send_splice"};
  all_metrics.insert(all_metrics.end(), send_metrics.begin(), send_metrics.end());
  all_metrics.push_back("memcpy_4mib_working_set");
  for (auto& m : af::bench::train_metrics())
    all_metrics.push_back(m);
  for (auto& m : af::bench::metrics_cost_metrics())
    all_metrics.push_back(m);
  const auto& embed_metrics = af::bench::embed_metrics();
  all_metrics.insert(all_metrics.end(), embed_metrics.begin(), embed_metrics.end());
  std::string only, only_list;
  int rounds = 2000, reps = 5;
  af::node_options opts;
  app.add_option("-m,--metric", only, "run this metric only")->check(CLI::IsMember(all_metrics));
  app.add_option("--only", only_list, "run these metrics only (comma-separated)");
  af::bench::train_bench_options topts;
  // Every number is checked here, at parse time: a bad one otherwise shows
  // up late and as something else ("ratio=-nan", a node that did not come up).
  constexpr long double max_int = std::numeric_limits<int>::max();
  using af::bench::positive_whole;
  int train_timeout_s = 180;
  add_train_options(app, topts, train_timeout_s);
  std::string transport = "data-plane";
  app.add_option("--transport", transport, "how sessions reach remote variables")
    ->check(CLI::IsMember({"data-plane", "basp"}));
  app.add_option("--rounds", rounds, "round trips for the latency figures")
    ->check(positive_whole("round trips", max_int));
  app.add_option("--reps", reps,
                 "repetitions of each 64 MiB transfer and loopback or memory probe (median; "
                 "memcpy_4mib_working_set takes at least 5)")
    ->check(positive_whole("repetitions", max_int));
  app.add_option("--scheduler", opts.scheduler, "CAF scheduler policy of client and node")
    ->check(CLI::IsMember({"sharing", "stealing"}));
  // The bound of a node's config file's `threads` (config/cluster_spec.cpp).
  app.add_option("--threads", opts.threads, "scheduler threads of client and node (0 = cores)")
    ->check(af::bench::number_check(
      {0, false, 256, true, "0 (one per core) or a positive whole number of threads"}));
  int poll_us = 50;
  app.add_option("--reply-poll-us", poll_us, "session_options::reply_poll in microseconds")
    ->check(af::bench::number_check(
      {0, false, max_int, true, "0 (never poll) or a positive whole number of microseconds"}));
  CLI11_PARSE(app, argc, argv);
  std::set<std::string> chosen;
  if (!only.empty())
    chosen.insert(only);
  std::istringstream names{only_list};
  for (std::string name; std::getline(names, name, ',');) {
    if (name.empty())
      continue;
    if (std::find(all_metrics.begin(), all_metrics.end(), name) == all_metrics.end()) {
      std::cerr << "actorflow-bench: no metric " << name << "; there are:";
      for (auto& m : all_metrics)
        std::cerr << ' ' << m;
      return std::cerr << std::endl, 2;
    }
    chosen.insert(name);
  }
  auto wanted = [&](const std::string& m) { return chosen.empty() || chosen.count(m) > 0; };
  topts.timeout = std::chrono::seconds(train_timeout_s);
  topts.bin_dir = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  std::printf("# actorflow-bench: cpu %s\n", cpu_description().c_str());
  std::fflush(stdout);

  // Before core_benches: its forks want a process without threads, and this
  // one leaves none behind.
  if (std::any_of(tls_metrics.begin(), tls_metrics.end(), wanted))
    if (int rc = af::bench::tls_benches(wanted, rounds, reps, poll_us))
      return rc;
  if (std::any_of(local_metrics.begin(), local_metrics.end(), wanted))
    if (int rc = af::bench::shm_benches(wanted, rounds, reps, poll_us))
      return rc;
  // The core metrics are TCP's (and BASP's): their node is on this host, so
  // its data connections would move to shared memory without this.
  const char* user_shm = std::getenv("ACTORFLOW_DATA_SHM");
  std::string saved_shm = user_shm != nullptr ? user_shm : "";
  setenv("ACTORFLOW_DATA_SHM", "off", 1);
  if (std::any_of(core_metrics.begin(), core_metrics.end(), wanted))
    if (int rc = af::bench::core_benches(wanted, opts, transport, rounds, reps, poll_us))
      return rc;
  if (user_shm != nullptr) // the training metrics' processes get what the user set
    setenv("ACTORFLOW_DATA_SHM", saved_shm.c_str(), 1);
  else
    unsetenv("ACTORFLOW_DATA_SHM");

  if (std::any_of(send_metrics.begin(), send_metrics.end(), wanted))
    if (int rc = af::bench::send_probe_bench(wanted, reps))
      return rc;
  if (int rc = af::bench::memory_probe_bench(wanted, reps))
    return rc;

  // What watching a node costs: an embedded cluster, then processes (fork + exec only).
  if (int rc = af::bench::run_metrics_benches(wanted, rounds, reps, topts))
    return rc;

  // The training metrics start their own processes (fork + exec only).
  std::vector<std::string> train_wanted;
  for (auto& m : af::bench::train_metrics())
    if (wanted(m))
      train_wanted.push_back(m);
  if (!train_wanted.empty())
    af::bench::run_train_benches(train_wanted, topts);
  // The sparse lines (fork + exec only; the lookup's worker node is this process's).
  if (int rc = af::bench::run_embed_benches(wanted))
    return rc;

  // Two node processes and a session (bench/bench_activation.hpp); the
  // raw peer is forked first, when this process's actor systems are gone.
  if (wanted(activation_metric)) {
    af::bench::raw_link raw;
    raw.start();
    std::vector<char> whole(size_t{64} << 20, 'w');
    raw.buffer_mbps(whole, true); // the peer allocates and faults its buffer
    if (int rc = af::bench::run_activation_bench(reps, [&] { return raw.buffer_mbps(whole, true); }))
      return rc;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  return af::last_resort("actorflow-bench", [&] { return main_body(argc, argv); });
}
