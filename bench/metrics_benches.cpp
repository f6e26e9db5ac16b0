// What watching a node costs (issue 27, part 3): the same work with a node's
// /metrics on (served and scraped every --scrape-ms, 15 x Prometheus' default
// rate at 1000) against off, alternately in one run. Off still counts: the
// counters are relaxed increments the serving paths always make; on adds the
// exporter's threads, its scrapes, and the requests a scrape makes to the
// node's actors.
#include "bench/metrics_benches.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "actors/session.hpp"
#include "bench/bench_util.hpp"
#include "bench/scraper.hpp"
#include "bench/stats.hpp"
#include "bench/train_common.hpp"
#include "bench/train_run.hpp"
#include "config/loopback.hpp"
#include "dist/embedded_cluster.hpp"
#include "metrics/node_metrics.hpp"

namespace af::bench {

namespace {

/// Remote assign_add round trips over TCP to two ps nodes of one embedded
/// cluster, ps 0 with /metrics (scraped), ps 1 without: each repetition
/// times `rounds` on each, in alternating order. ops/s per side (ratio:
/// on / off, >= 0.97 is the target).
int remote_assign_add(int rounds, int reps, int scrape_ms) {
  train_run::scoped_shm tcp{false};
  auto opts = embedded_cluster::defaults();
  opts.metrics_port = free_loopback_port();
  auto cluster = ok(embedded_cluster::start({{"ps", 2}, {"worker", 1}}, opts), "cluster");
  auto metrics = ok(start_node_metrics(cluster->system("ps", 0), cluster->node("ps", 0),
                                       "/job:ps/task:0", opts),
                    "metrics");
  auto s = ok(cluster->session_for("worker", 0), "session");
  std::vector<output> incs;
  for (int ps = 0; ps < 2; ++ps) {
    auto d = ok(s.device("/job:ps/task:" + std::to_string(ps)), "device");
    auto v = ok(s.variable("counter" + std::to_string(ps), {}, initializer::zeros()), "variable");
    incs.push_back(s.assign_add(v, s.constant(tensor::scalar(1))));
  }
  if (auto err = s.initialize())
    return std::fprintf(stderr, "actorflow-bench: %s\n", describe(err).c_str()), 1;
  auto time_ops = [&](const output& inc, int n) {
    auto t0 = clock_type::now();
    for (int i = 0; i < n; ++i) // as remote_assign_add_rtt: the new value comes back
      ok(s.run(inc), "assign_add");
    return n / std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  time_ops(incs[0], 200); // warm-up: connections, the first frames
  time_ops(incs[1], 200);
  scraper watcher{{metrics->port()}, std::chrono::milliseconds{scrape_ms}};
  std::vector<double> on, off;
  for (int rep = 0; rep < reps; ++rep) {
    bool on_first = rep % 2 == 0;
    for (int side = 0; side < 2; ++side) {
      bool with = (side == 0) == on_first;
      (with ? on : off).push_back(time_ops(incs[with ? 0 : 1], rounds));
    }
  }
  watcher.stop();
  // Each repetition's on / off, its two blocks side by side: the machine's
  // drift (other processes come and go) cancels within a pair.
  std::vector<double> paired;
  for (size_t k = 0; k < on.size() && k < off.size(); ++k)
    paired.push_back(on[k] / off[k]);
  std::printf("# metrics_remote_assign_add_rtt: the median of the repetitions' own on/off: %.3f\n",
              median(paired));
  std::printf("# metrics_remote_assign_add_rtt: embedded 2 ps + 1 worker over TCP; ps 0 serves "
              "/metrics, scraped every %d ms (%llu scrapes answered), ps 1 does not; %d reps of "
              "%d round trips each, alternating; median round trip on %.2f us, off %.2f us\n",
              scrape_ms, static_cast<unsigned long long>(watcher.answered()), reps, rounds,
              1e6 / median(on), 1e6 / median(off));
  train_run::report("metrics_remote_assign_add_rtt", on, off, "ops/s", "");
  return 0;
}

/// The 1 M sync workload (train_sync_1m_2w_tcp's: 1 ps + 2 workers,
/// processes, TCP) with every task serving /metrics and scraped, against
/// the same job without, alternating.
void train_sync(const train_bench_options& o) {
  train_run::scratch_dir dir;
  if (dir.path.empty()) {
    std::printf("metric metrics_train_sync_1m_2w_tcp skipped: no scratch folder in /tmp\n");
    return;
  }
  train_run::scoped_shm tcp{false};
  auto keys = linear_keys("sync", o);
  auto with = o;
  with.metrics = true;
  std::vector<double> on, off;
  std::string failure;
  uint64_t scrapes = 0;
  for (int rep = 0; rep < o.reps && failure.empty(); ++rep) {
    bool on_first = rep % 2 == 0;
    for (int side = 0; side < 2 && failure.empty(); ++side) {
      bool metrics = (side == 0) == on_first;
      auto run = train_run::run_cluster(keys, metrics ? with : o, dir,
                                        metrics ? "metrics-on" : "metrics-off");
      scrapes += run.scrapes;
      if (auto x = train_run::steps_per_s(run, failure))
        (metrics ? on : off).push_back(*x);
    }
  }
  std::printf("# metrics_train_sync_1m_2w_tcp: 1 ps + 2 workers (processes) over TCP, each task "
              "serving /metrics scraped every %d ms (%llu scrapes answered) against none; %d "
              "reps, alternating\n",
              o.scrape_ms, static_cast<unsigned long long>(scrapes), o.reps);
  if (!failure.empty())
    std::fprintf(stderr, "actorflow-bench: metrics_train_sync_1m_2w_tcp: %s\n", failure.c_str());
  train_run::report("metrics_train_sync_1m_2w_tcp", on, off, "steps/s", failure);
}

} // namespace

const std::vector<std::string>& metrics_cost_metrics() {
  static const std::vector<std::string> names{"metrics_remote_assign_add_rtt",
                                              "metrics_train_sync_1m_2w_tcp"};
  return names;
}

int run_metrics_benches(const wanted_fn& wanted, int rounds, int reps,
                        const train_bench_options& topts) {
  if (wanted("metrics_remote_assign_add_rtt"))
    if (int rc = remote_assign_add(rounds, reps, topts.scrape_ms))
      return rc;
  if (wanted("metrics_train_sync_1m_2w_tcp"))
    train_sync(topts);
  return 0;
}

} // namespace af::bench
