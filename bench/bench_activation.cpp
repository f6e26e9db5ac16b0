#include "bench/bench_activation.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <vector>

#include "caf/all.hpp"

#include "actors/session.hpp"
#include "actors/system.hpp"
#include "bench/stats.hpp"
#include "config/cluster_spec.hpp"
#include "config/loopback.hpp"
#include "core/child_process.hpp"
#include "messages/error.hpp"

namespace af::bench {

namespace {

void print_metric(const std::string& name, double ours, double baseline, const char* unit) {
  std::printf("metric %s ours=%.3f baseline=%.3f unit=%s ratio=%.3f\n", name.c_str(), ours, baseline,
              unit, baseline > 0 ? ours / baseline : 0.0);
  std::fflush(stdout);
}

/// The two node processes of one run, stopped (SIGTERM) when it ends (and
/// killed if the bench dies first).
struct two_nodes {
  std::vector<child_process> nodes;
  std::string config;

  bool start(const cluster_spec& spec, bool shm) {
    config = "/tmp/actorflow-bench-act-" + std::to_string(getpid()) + ".toml";
    std::ofstream{config} << spec.to_toml(node_options{});
    auto bin = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "actorflow-node";
    for (int task = 0; task < 2; ++task) {
      child_spec cs;
      cs.argv = {bin.string(), "--config", config, "--job", "local", "--task", std::to_string(task)};
      if (!shm)
        cs.set_env = {{"ACTORFLOW_DATA_SHM", "off"}};
      else
        cs.unset_env = {"ACTORFLOW_DATA_SHM"};
      cs.out = cs.err = child_output::discard;
      nodes.emplace_back(cs);
      if (!nodes.back().started())
        return false;
    }
    return true;
  }

  ~two_nodes() {
    for (auto& node : nodes)
      node.signal(SIGTERM);
    for (auto& node : nodes)
      node.wait();
    std::filesystem::remove(config);
  }
};

/// One configuration: `label` says how; the medians of the edge's MB/s and
/// of the raw transfers in between. False if something failed (said why).
bool measure(bool shm, bool data_plane, int reps, const std::function<double()>& b2b_mbps,
             double& ours, double& base, std::string& path) {
  auto port = [] { return "127.0.0.1:" + std::to_string(free_loopback_port()); };
  auto spec = cluster_spec::from_jobs({{"local", {port(), port()}}, {"client", {port()}}});
  if (!spec) {
    std::cerr << "actorflow-bench: " << describe(spec.error()) << std::endl;
    return false;
  }
  two_nodes nodes;
  if (!nodes.start(*spec, shm)) {
    std::cerr << "actorflow-bench: cannot start the two nodes" << std::endl;
    return false;
  }
  node_options copts;
  copts.threads = 2;
  system_config cfg{copts};
  auto sys_owner = af::start_actor_system(cfg);
  caf::actor_system& sys = *sys_owner;
  session_options so;
  so.timeout = std::chrono::seconds(120);
  so.data_plane = data_plane;
  auto s = session::make(sys, *spec, "/job:client/task:0", so);
  if (!s) {
    std::cerr << "actorflow-bench: " << describe(s.error()) << std::endl;
    return false;
  }
  for (int t = 0; t < 2; ++t)
    if (auto err = s->wait_for_node("local", t, std::chrono::seconds(20))) {
      std::cerr << "actorflow-bench: node " << t << " did not come up: " << describe(err) << std::endl;
      return false;
    }
  const int64_t n = 16 << 20; // 64 MiB of float32
  auto x = s->placeholder("x");
  output y, z;
  {
    auto d = s->device("/job:local/task:0");
    // A scalar fed, 64 MiB made on task 0: only the edge moves the bytes.
    y = s->add(x, s->constant(tensor::filled(dtype::float32, {n}, 0)), "activation");
  }
  {
    auto d = s->device("/job:local/task:1");
    z = s->reduce_sum(y);
  }
  std::vector<double> edge, raw;
  for (int i = -2; i < reps; ++i) { // two warm-up steps (registration, shared memory offer)
    run_trace trace;
    auto r = s->run({z}, {{x, tensor::scalar(1)}}, &trace);
    if (!r) {
      std::cerr << "actorflow-bench: step failed: " << describe(r.error()) << std::endl;
      return false;
    }
    const trace_entry* e = nullptr;
    for (const auto& t : trace.entries)
      if (t.kind == "transfer" && t.op.rfind("activation -> ", 0) == 0)
        e = &t;
    if (e == nullptr || e->bytes_in != static_cast<uint64_t>(n) * 4) {
      std::cerr << "actorflow-bench: no 64 MiB transfer of the activation in the trace" << std::endl;
      return false;
    }
    path = e->note;
    if (i < 0)
      continue;
    auto secs = std::max<int64_t>(e->end_ns - e->start_ns, 1) / 1e9;
    edge.push_back(n * 4 / 1e6 / secs);
    raw.push_back(b2b_mbps());
  }
  ours = median(edge);
  base = median(raw);
  return true;
}

} // namespace

int run_activation_bench(int reps, const std::function<double()>& b2b_mbps) {
  struct run {
    const char* metric;
    bool shm, data_plane;
    const char* expect;
    int reps;
  };
  const run runs[] = {
    {"model_parallel_64mib_activation", false, true, "data plane (tcp)", reps},
    {"model_parallel_64mib_activation_local", true, true, "data plane (shared memory)", reps},
    {"model_parallel_64mib_activation_caf", false, false, "CAF message", std::min(reps, 3)},
  };
  for (const auto& r : runs) {
    double ours = 0, base = 0;
    std::string path;
    if (!measure(r.shm, r.data_plane, r.reps, b2b_mbps, ours, base, path))
      return 1;
    std::printf("# %s: two node processes on this host; the edge's trace says: %s\n", r.metric,
                path.c_str());
    if (path.find(r.expect) == std::string::npos) {
      std::cerr << "actorflow-bench: " << r.metric << " went another way than " << r.expect
                << std::endl;
      return 1;
    }
    print_metric(r.metric, ours, base, "MB/s");
  }
  return 0;
}

} // namespace af::bench
