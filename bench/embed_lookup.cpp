// embed_lookup_512_3ps_tcp (embed_benches.hpp): actorflow's partitioned
// lookup over 3 ps processes against the raw-TCP shard servers, alternating
// blocks of lookups.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>

#include "caf/all.hpp"

#include "actors/node.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "bench/bench_train.hpp"
#include "bench/bench_util.hpp"
#include "bench/embed_benches.hpp"
#include "bench/embed_raw.hpp"
#include "bench/proc_stats.hpp"
#include "bench/train_run.hpp"
#include "config/loopback.hpp"
#include "graph/embedding.hpp"

namespace af::bench::embed_detail {

namespace {

using namespace train_run;

const char* const metric = "embed_lookup_512_3ps_tcp";
constexpr int64_t table_rows = 1000000, dim = 64, batch = 512;
constexpr int shards = 3;
constexpr int block = 25, blocks = 40; // 1000 lookups of each side
constexpr int batches = 64;            // distinct batches, cycled

/// Processes that are stopped (SIGTERM) and reaped when this ends.
struct process_group {
  std::vector<child_process> kids;
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (auto& k : kids)
      out.push_back(k.pid());
    return out;
  }
  ~process_group() {
    for (auto& k : kids)
      k.signal(SIGTERM);
    for (auto& k : kids)
      k.wait();
  }
};

/// The raw shard servers of a `rows` x `dim` table: ports[i] serves shard i.
bool start_raw_shards(process_group& g, std::vector<uint16_t>& ports, int64_t rows,
                      const scratch_dir& dir, const std::string& tag) {
  for (int k = 0; k < shards; ++k) {
    uint16_t port = 0;
    int lfd = listen_on_loopback(port, 16);
    if (lfd < 0)
      return false;
    g.kids.push_back(spawn({self_exe(), helper_flag, "embed-shard",
                            "listen-fd=" + std::to_string(lfd), "shard=" + std::to_string(k),
                            "shards=" + std::to_string(shards), "rows=" + std::to_string(rows),
                            "dim=" + std::to_string(dim)},
                           dir.path / (tag + std::to_string(k) + ".log"), lfd));
    close(lfd);
    ports.push_back(port);
    if (!g.kids.back().started())
      return false;
  }
  return true;
}

/// The latencies (us) and socket bytes of one side.
struct side {
  std::vector<double> us, block_medians;
  uint64_t bytes = 0;
  bool bytes_known = true;
  size_t lookups = 0;

  template <class Lookup>
  void run_block(const std::vector<pid_t>& pids, int first, Lookup&& lookup) {
    auto before = socket_bytes_of(pids);
    std::vector<double> these;
    for (int i = 0; i < block; ++i) {
      auto t0 = clock_type::now();
      lookup((first + i) % batches);
      these.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    auto after = socket_bytes_of(pids);
    if (before && after)
      bytes += *after - *before;
    else
      bytes_known = false;
    lookups += these.size();
    block_medians.push_back(median(these));
    us.insert(us.end(), these.begin(), these.end());
  }

  double p99() const {
    auto v = us;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(0.99 * v.size()))];
  }
  double bytes_per_lookup() const { return bytes_known ? double(bytes) / double(lookups) : -1; }
};

/// The three ps nodes (actorflow-node processes, TCP) of `spec`.
bool start_ps_nodes(process_group& g, const cluster_spec& spec, const scratch_dir& dir) {
  auto config = dir.path / "embed-cluster.toml";
  std::ofstream{config} << spec.to_toml(node_options{});
  auto node_bin = std::filesystem::path{self_exe()}.parent_path() / "actorflow-node";
  for (int k = 0; k < shards; ++k) {
    g.kids.push_back(spawn({node_bin.string(), "--config", config.string(), "--job", "ps",
                            "--task", std::to_string(k)},
                           dir.path / ("embed-ps" + std::to_string(k) + ".log")));
    if (!g.kids.back().started())
      return false;
  }
  return true;
}

/// Where one lookup's time goes: each op and transfer of a traced run, in
/// us from the step's first entry, as `#` lines.
void print_trace(session& s, output looked_up, output ids_in, const tensor& feed) {
  run_trace trace;
  ok(s.run({looked_up}, {{ids_in, feed}}, &trace), "traced lookup");
  int64_t t0 = INT64_MAX;
  for (const auto& e : trace.entries)
    t0 = std::min(t0, e.start_ns);
  std::printf("# %s: one traced lookup (us from its first entry; device; bytes in):\n", metric);
  for (const auto& e : trace.entries)
    std::printf("#   %8.1f..%8.1f  %-12s %-40s %s  %llu\n", (e.start_ns - t0) / 1e3,
                (e.end_ns - t0) / 1e3, e.kind.c_str(), e.op.c_str(), e.device.c_str(),
                static_cast<unsigned long long>(e.bytes_in));
}

/// The lines of the lookup metric: what was measured and how, the latencies,
/// the empty step's, and the bytes at the sockets.
void print_lines(const side& ours, const side& base, const side& empty, double unique_mean) {
  std::printf("# %s: %lld x %lld float32 table, mod over 3 ps processes (actorflow-node, TCP), "
              "%lld skewed ids per lookup (%.1f distinct on average) from a session on a worker "
              "node in this process; baseline: 3 raw-TCP shard processes, the client dedups, "
              "routes, asks all shards at once, assembles; %d alternating blocks of %d lookups "
              "each; latency lower is better\n",
              metric, static_cast<long long>(table_rows), static_cast<long long>(dim),
              static_cast<long long>(batch), unique_mean, blocks, block);
  std::printf("# %s noise: block medians us: ours %.1f..%.1f, baseline %.1f..%.1f\n", metric,
              *std::min_element(ours.block_medians.begin(), ours.block_medians.end()),
              *std::max_element(ours.block_medians.begin(), ours.block_medians.end()),
              *std::min_element(base.block_medians.begin(), base.block_medians.end()),
              *std::max_element(base.block_medians.begin(), base.block_medians.end()));
  report(metric, median(ours.us), median(base.us), "us");
  report(std::string{metric} + "_p99", ours.p99(), base.p99(), "us");
  std::printf("# %s: a step of the same shape with nothing to look up (a scalar through an "
              "add on each ps): median %.1f us, p99 %.1f us\n",
              metric, median(empty.us), empty.p99());
  // Measured at the ps processes' sockets (ss), both directions, all
  // their connections; against what must cross: the distinct ids out and
  // their rows back.
  double touched = unique_mean * (8 + dim * 4);
  if (ours.bytes_known && base.bytes_known) {
    report(std::string{metric} + "_bytes", ours.bytes_per_lookup(), base.bytes_per_lookup(), "B");
    std::printf("# %s_bytes: touched rows + ids %.0f B per lookup: ours/touched %.3f, "
                "baseline/touched %.3f\n",
                metric, touched, ours.bytes_per_lookup() / touched,
                base.bytes_per_lookup() / touched);
  } else {
    std::printf("# %s_bytes: not measured (ss did not run)\n", metric);
  }
}

/// Stops this process's worker node (its data plane first: its threads hold
/// actors of the system) before the actor system goes, on every way out.
struct worker_node_guard {
  running_node& node;
  ~worker_node_guard() {
    node.data_plane->stop();
    unregister_local_node(node.address);
    caf::anon_send_exit(node.actor, caf::exit_reason::user_shutdown);
  }
};

int fail(const std::string& why) {
  std::cerr << "actorflow-bench: " << metric << ": " << why << std::endl;
  return 1;
}

} // namespace

int lookup_bench() {
  scratch_dir dir;
  scoped_shm plane{false}; // the ps processes and this process's node: TCP
  // The raw shards first (fork + exec), then the ps nodes.
  process_group raw;
  std::vector<uint16_t> raw_ports;
  if (!start_raw_shards(raw, raw_ports, table_rows, dir, "embed-raw-shard"))
    return fail("cannot start the raw shard servers");
  auto port = [] { return "127.0.0.1:" + std::to_string(free_loopback_port()); };
  auto spec = cluster_spec::from_jobs({{"ps", {port(), port(), port()}}, {"worker", {port()}}});
  if (!spec)
    return fail(describe(spec.error()));
  process_group ps;
  if (!start_ps_nodes(ps, *spec, dir))
    return fail("cannot start the ps nodes");

  // This process is the worker: its node runs the lookup's worker ops
  // (unique, route, partition, stitch), its session drives the steps.
  node_options wopts;
  system_config cfg{wopts};
  auto sys_owner = start_actor_system(cfg);
  auto& sys = *sys_owner;
  auto waddr = spec->address("worker", 0);
  auto node = start_node(sys, "worker", 0, "127.0.0.1", waddr->port, wopts);
  if (!node)
    return fail("worker node: " + describe(node.error()));
  worker_node_guard guard{*node};
  {
    session_options so;
    so.timeout = std::chrono::seconds(60);
    auto s = ok(session::make(sys, *spec, "/job:worker/task:0", so), "session");
    for (int k = 0; k < shards; ++k)
      if (auto err = s.wait_for_node("ps", k, std::chrono::seconds(30)))
        return fail("ps " + std::to_string(k) + " did not come up: " + describe(err));
    auto sizes = kernels::balanced_shard_rows(table_rows, shards);
    std::vector<output> vars;
    for (int k = 0; k < shards; ++k) {
      auto scope = ok(s.device("/job:ps/task:" + std::to_string(k)), "device");
      vars.push_back(ok(s.variable(shard_name("emb", static_cast<size_t>(k)), {sizes[k], dim},
                                   initializer::uniform(-1, 1, 1)),
                        "shard variable"));
    }
    auto table = embedding_table_of(s.graph_def(), "emb", kernels::partition_strategy::mod, vars);
    if (!table)
      return fail(table.error().what);
    if (auto err = s.initialize(vars))
      return fail(describe(err));
    auto ids_in = s.placeholder("ids");
    auto looked_up = embedding_lookup(s.builder(), *table, ids_in);
    if (!looked_up)
      return fail(looked_up.error().what);

    raw_embed_client client;
    if (!client.connect(raw_ports, table_rows, dim))
      return fail("cannot reach the raw shard servers");
    std::mt19937_64 rng{25};
    std::vector<std::vector<int64_t>> ids(batches, std::vector<int64_t>(batch));
    std::vector<tensor> feeds;
    size_t unique_sum = 0;
    for (auto& b : ids) {
      skewed_ids(rng, table_rows, b);
      feeds.push_back(tensor::from_values<int64_t>({batch}, b));
      client.route(b);
      unique_sum += client.unique_count();
    }
    // What the lookups must give: the shards' values, read once.
    std::vector<tensor> shard_values;
    for (auto& v : vars)
      shard_values.push_back(ok(s.run(v), "read a shard"));
    std::vector<float> raw_rows;
    auto raw_lookup = [&](int b) {
      client.route(ids[b]);
      if (!client.gather(0))
        std::cerr << "actorflow-bench: raw lookup failed" << std::endl, std::exit(1);
      client.assemble(raw_rows);
    };
    auto ours_lookup = [&](int b) { return ok(s.run({*looked_up}, {{ids_in, feeds[b]}}), "lookup"); };
    // Each gives its table's rows, bit for bit (and warms up: registration,
    // connections): ours the shards' values, the raw one embed_value's.
    for (int b = 0; b < batches; ++b) {
      auto got = ours_lookup(b);
      raw_lookup(b);
      if (got.at(0).shape() != shape_type{batch, dim})
        return fail("the lookup's shape is not [512, 64]");
      for (int64_t i = 0; i < batch; ++i) {
        auto id = ids[b][i];
        const float* want = shard_values[id % shards].data<float>() + (id / shards) * dim;
        if (std::memcmp(got[0].data<float>() + i * dim, want, dim * sizeof(float)) != 0)
          return fail("actorflow's lookup gave a wrong row for id " + std::to_string(id));
        for (int64_t c = 0; c < dim; ++c)
          if (raw_rows[i * dim + c] != embed_value(id, c, dim))
            return fail("the raw lookup gave a wrong row for id " + std::to_string(id));
      }
    }
    shard_values.clear();
    // What any step of this shape costs, with nothing to look up: a scalar
    // fed on the worker, one add on each ps, the three summed on the worker.
    auto x = s.placeholder("x");
    output fan_in;
    for (int k = 0; k < shards; ++k) {
      auto scope = ok(s.device("/job:ps/task:" + std::to_string(k)), "device");
      auto y = s.add(x, s.constant(tensor::scalar(1)), "empty_" + std::to_string(k));
      scope.reset();
      fan_in = k == 0 ? y : s.add(fan_in, y);
    }
    auto empty_step = [&](int) { ok(s.run({fan_in}, {{x, tensor::scalar(1)}}), "empty step"); };
    empty_step(0);
    side ours, base, empty;
    auto ps_pids = ps.pids(), raw_pids = raw.pids();
    for (int k = 0; k < blocks; ++k) {
      ours.run_block(ps_pids, k * block, [&](int b) { ours_lookup(b); });
      base.run_block(raw_pids, k * block, raw_lookup);
      empty.run_block(ps_pids, k * block, empty_step);
    }
    print_lines(ours, base, empty, double(unique_sum) / batches);
    print_trace(s, *looked_up, ids_in, feeds[0]);
    double shard_mib = double(sizes[0] * dim * 4) / 1048576.0;
    print_rss(metric, "ps (actorflow-node)", ps_pids, shard_mib);
    print_rss(metric, "raw shard", raw_pids, shard_mib);
    std::fflush(stdout);
  }
  return 0;
}

} // namespace af::bench::embed_detail
