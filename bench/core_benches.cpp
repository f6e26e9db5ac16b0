// actorflow-bench's core metrics: one ps node (a real actorflow-node
// process) against the raw TCP peer, and local actors against bare CAF.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <cblas.h>

#include "caf/all.hpp"

#include "actors/session.hpp"
#include "actors/system.hpp"
#include "bench/benches.hpp"
#include "bench/raw_link.hpp"
#include "config/cluster_spec.hpp"
#include "config/loopback.hpp"
#include "core/child_process.hpp"
#include "dist/embedded_cluster.hpp"
#include "kernels/kernels.hpp"
#include "train/optimizer.hpp"

namespace af::bench {

namespace {

// -- the ps node -------------------------------------------------------------------

/// The ps: actorflow-node --job ps --task 0, its output this process's;
/// stopped (SIGTERM) at the end, killed if the bench dies first.
struct node_process {
  child_process child;
  pid_t pid = -1;
  std::string config;

  bool start(const af::cluster_spec& spec, const af::node_options& opts) {
    config = "/tmp/actorflow-bench-" + std::to_string(getpid()) + ".toml";
    std::ofstream{config} << spec.to_toml(opts);
    auto self = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "actorflow-node";
    child_spec cs;
    cs.argv = {self.string(), "--config", config, "--job", "ps", "--task", "0"};
    child = child_process{cs};
    if (!child.started())
      std::fprintf(stderr, "actorflow-bench: %s\n", child.start_error().c_str());
    pid = child.pid();
    return child.started();
  }

  ~node_process() {
    if (child.signal(SIGTERM))
      child.wait();
    std::filesystem::remove(config);
  }
};

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM).
long proc_status_kib(pid_t pid, const std::string& field) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0)
      return std::stol(line.substr(field.size() + 1));
  return -1;
}

/// A bare CAF actor answering ping: the local request/response baseline.
caf::behavior echo_impl() {
  return {[](caf::ping_atom, int64_t x) { return x; }};
}

/// What the metrics of the ps node share: the raw peer, the node, this
/// process's session on it (its device scope held by core_benches).
struct ps_bench {
  const std::function<bool(const std::string&)>& wanted;
  af::node_options opts;
  int rounds;
  int reps;
  raw_link& raw;
  node_process& ps;
  caf::actor_system& sys;
  af::cluster_spec spec;
  af::session_options sopts;
  af::session& s;
};

int remote_assign_add_rtt(ps_bench& c) {
  auto& s = c.s;
  auto& raw = c.raw;
  auto rounds = c.rounds;
  auto v = ok(s.variable("counter", {}, af::initializer::zeros()), "variable");
  if (auto err = s.initialize({v}))
    return std::cerr << af::describe(err) << std::endl, 1;
  auto inc = s.assign_add(v, s.constant(af::tensor::scalar(1)));
  // Blocks of ours and of the raw echo alternate, so that both sample the
  // same stretch of time: on a small VM where threads land decides the
  // round trip (~14 vs ~50 us) for raw sockets and for us alike. Within a
  // block each side runs in its steady state.
  auto [ours, base] = rtt_against_echo(raw, rounds, [&] { ok(s.run(inc), "assign_add"); });
  report("remote_assign_add_rtt", ours, base, "us");
  return 0;
}

int tensor_64mib(ps_bench& c) {
  auto& s = c.s;
  auto& raw = c.raw;
  auto& ps = c.ps;
  auto& wanted = c.wanted;
  auto reps = c.reps;
  auto rss_before_kib = proc_status_kib(ps.pid, "VmRSS");
  const int64_t n = 16 << 20; // 64 MiB of float32
  auto big = ok(s.variable("big", {n}), "variable");
  auto value = af::tensor::filled(af::dtype::float32, {n}, 1);
  auto assign = s.assign(big, s.constant(value));
  std::vector<char> buf(1 << 20, 'x');
  auto mbps = [&](auto&& f) {
    auto t0 = clock_type::now();
    f();
    return value.nbytes() / 1e6 / std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  auto must = [](caf::error err) {
    if (err) {
      std::cerr << "actorflow-bench: " << af::describe(err) << std::endl;
      std::exit(1);
    }
  };
  std::vector<double> ours_w, base_w, ours_r, base_r, b2b_w, b2b_r, copies;
  // The fair baselines (issue 12, part 3): the same 64 MiB raw TCP buffer to
  // buffer, and one memcpy of it, both buffers allocated once and pre-faulted.
  std::vector<char> whole(value.nbytes(), 'w'), copy(value.nbytes(), 'c');
  raw.buffer_mbps(whole, true); // the peer allocates and faults its buffer
  must(s.run_targets({assign})); // initializes; also warms both ends
  for (int i = 0; i < reps; ++i) {
    if (wanted("tensor_64mib_assign")) {
      ours_w.push_back(mbps([&] { must(s.run_targets({assign})); }));
      base_w.push_back(raw.stream_mbps(value.nbytes(), true, buf));
      b2b_w.push_back(raw.buffer_mbps(whole, true));
    }
    if (wanted("tensor_64mib_read")) {
      ours_r.push_back(mbps([&] { ok(s.run(big), "read"); }));
      base_r.push_back(raw.stream_mbps(value.nbytes(), false, buf));
      b2b_r.push_back(raw.buffer_mbps(whole, false));
    }
    copies.push_back(memcpy_mbps(copy, whole));
  }
  if (!ours_w.empty()) {
    report("tensor_64mib_assign", median(ours_w), median(base_w), "MB/s");
    report("tensor_64mib_assign_vs_b2b", median(ours_w), median(b2b_w), "MB/s");
    report("raw_tcp_b2b_64mib_upload", median(b2b_w), median(base_w), "MB/s");
  }
  if (!ours_r.empty()) {
    report("tensor_64mib_read", median(ours_r), median(base_r), "MB/s");
    report("tensor_64mib_read_vs_b2b", median(ours_r), median(b2b_r), "MB/s");
    report("raw_tcp_b2b_64mib_download", median(b2b_r), median(base_r), "MB/s");
  }
  // How far a shared-memory path could go past TCP here: one core's memcpy
  // against the raw buffer-to-buffer transfer.
  if (!b2b_w.empty() || !b2b_r.empty())
    report("memcpy_64mib", median(copies), median(b2b_w.empty() ? b2b_r : b2b_w), "MB/s");
  // What the node's peak resident memory grew by while the tensors passed
  // through it, against the tensor's own size (1.0 = the value alone).
  auto gained_mib = (proc_status_kib(ps.pid, "VmHWM") - rss_before_kib) / 1024.0;
  if (wanted("node_rss_64mib"))
    report("node_rss_64mib", gained_mib, value.nbytes() / 1048576.0, "MiB");
  return 0;
}

int fanin_8x4mib(ps_bench& c) {
  auto& s = c.s;
  auto& raw = c.raw;
  auto& sys = c.sys;
  auto& spec = c.spec;
  auto& sopts = c.sopts;
  auto reps = c.reps;
  // Eight workers, each its own session (and connection), push a 4 MiB
  // gradient into one ps variable at once, four times each.
  const int workers = 8, rounds_each = 4;
  const int64_t n = 1 << 20; // 4 MiB of float32
  auto sum = ok(s.variable("grad_sum", {n}, af::initializer::zeros()), "variable");
  if (auto err = s.initialize({sum}))
    return std::cerr << af::describe(err) << std::endl, 1;
  std::vector<af::session> sessions;
  std::vector<af::output> pushes;
  auto grad = af::tensor::filled(af::dtype::float32, {n}, 0.5);
  for (int w = 0; w < workers; ++w) {
    sessions.push_back(ok(af::session::make(sys, spec, "/job:worker/task:0", sopts), "session"));
    auto& ws = sessions.back();
    auto d = ok(ws.device("/job:ps/task:0"), "device");
    auto v = ok(ws.variable("grad_sum", {n}), "variable");
    pushes.push_back(ws.assign_add(v, ws.constant(grad)));
    if (auto err = ws.run_targets({pushes.back()})) // connect and warm up
      return std::cerr << af::describe(err) << std::endl, 1;
  }
  std::vector<double> ours, base;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    auto t0 = clock_type::now();
    for (int w = 0; w < workers; ++w)
      threads.emplace_back([&, w] {
        for (int r = 0; r < rounds_each; ++r)
          if (sessions[w].run_targets({pushes[w]}))
            ++failures;
      });
    for (auto& t : threads)
      t.join();
    auto secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (failures > 0)
      return std::cerr << "actorflow-bench: fan-in pushes failed" << std::endl, 1;
    ours.push_back(workers * rounds_each * (grad.nbytes() / 1e6) / secs);
    base.push_back(raw.fanin_mbps(workers, rounds_each, grad.nbytes()));
  }
  // every push landed: 8 warm-ups + 8 x 4 x reps, each adding 0.5
  auto total = ok(s.run(sum), "read grad_sum").at(0);
  auto expected = 0.5 * (workers + workers * rounds_each * reps);
  if (total != expected)
    return std::cerr << "actorflow-bench: fan-in lost updates: " << total << " != " << expected
                     << std::endl, 1;
  report("fanin_8x4mib", median(ours), median(base), "MB/s");
  return 0;
}

int gemm_2048_cpu(ps_bench& c) {
  auto& opts = c.opts;
  auto reps = c.reps;
  // A 2048x2048 float32 matmul through a node's CPU executor actor (in this
  // process: the operands are not copied), against cblas_sgemm called
  // directly on the same data, alternating, median of each.
  const int n = 2048;
  auto local = ok(af::embedded_cluster::start({{"local", 1}}, opts), "embedded node");
  std::vector<double> ours, base;
  {
    auto ls = ok(local->session_for("local", 0), "local session");
    af::tensor a{af::dtype::float32, {n, n}}, b{af::dtype::float32, {n, n}};
    af::kernels::fill_uniform(a, -1, 1, 1);
    af::kernels::fill_uniform(b, -1, 1, 2);
    auto product = ls.matmul(ls.constant(a), ls.constant(b));
    af::tensor c{af::dtype::float32, {n, n}};
    auto gflops = [&](auto&& f) {
      auto t0 = clock_type::now();
      f();
      return 2.0 * n * n * n / 1e9 / std::chrono::duration<double>(clock_type::now() - t0).count();
    };
    ok(ls.run(product), "matmul"); // warm-up: OpenBLAS threads, buffers
    for (int i = 0; i < reps; ++i) {
      ours.push_back(gflops([&] { ok(ls.run(product), "matmul"); }));
      base.push_back(gflops([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n,
                    b.data<float>(), n, 0.0f, c.mutable_data<float>(), n);
      }));
    }
  }
  report("gemm_2048_cpu", median(ours), median(base), "GFLOP/s");
  return 0;
}

/// The non-finite check as written by hand for the baseline ISA (SSE2 on
/// x86-64): train::first_non_finite's loop, without its AVX2 version.
size_t first_non_finite_baseline(const float* data, size_t n) {
  uint32_t carry = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof(bits));
    carry |= (bits & 0x7f800000u) + 0x00800000u;
  }
  return (carry & 0x80000000u) == 0 ? n : 0;
}

int nonfinite_check_1m(ps_bench& c) {
  // The check every push gets twice (worker and ps): 1 M floats (a 1 M
  // push, in cache as a push just written is), train::first_non_finite (its
  // AVX2 version where the CPU has it) against the same loop built for the
  // baseline ISA, alternating, median GB/s of each.
  const size_t n = 1'000'000;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
  std::vector<double> ours, base;
  size_t found = 0;
  auto gbs = [&](auto&& check) {
    constexpr int passes = 50;
    auto t0 = clock_type::now();
    for (int k = 0; k < passes; ++k) {
      asm volatile("" : : "r"(v.data()) : "memory"); // each pass reads the floats again
      found += check(v.data(), n);
    }
    double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    return passes * n * sizeof(float) / 1e9 / s;
  };
  for (int i = 0; i < std::max(c.reps, 5); ++i) {
    ours.push_back(gbs(af::train::first_non_finite));
    base.push_back(gbs(first_non_finite_baseline));
  }
  if (found != 2 * n * 50 * ours.size())
    return std::cerr << "actorflow-bench: the checks found a non-finite float in finite data"
                     << std::endl,
           1;
  report("nonfinite_check_1m", median(ours), median(base), "GB/s");
  return 0;
}

int gpu_benches(ps_bench& c) {
  auto& opts = c.opts;
  auto& wanted = c.wanted;
  auto reps = c.reps;
  // Through GPU 0's executor actor, in this process, against device-resident
  // cuBLAS and a device-to-device copy of the same bytes. The executor stages
  // operands host <-> device per op today: that cost is in the ratio.
  auto local = ok(af::embedded_cluster::start({{"local", 1}}, opts), "embedded node");
  auto ls = ok(local->session_for("local", 0), "local session");
  auto gpu = ok(ls.device("/gpu:0"), "device");
  auto time_of = [&](af::output out) {
    ok(ls.run(out), "warm-up");
    std::vector<double> s;
    for (int i = 0; i < reps; ++i) {
      auto t0 = clock_type::now();
      ok(ls.run(out), "gpu op");
      s.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    }
    return median(s);
  };
  if (wanted("gemm_4096_gpu")) {
    const int n = 4096;
    af::tensor a{af::dtype::float32, {n, n}}, b{af::dtype::float32, {n, n}};
    af::kernels::fill_uniform(a, -1, 1, 1);
    af::kernels::fill_uniform(b, -1, 1, 2);
    auto secs = time_of(ls.matmul(ls.constant(a), ls.constant(b)));
    report("gemm_4096_gpu", 2.0 * n * n * n / 1e9 / secs, af::kernels::cuda_sgemm_gflops(n, reps),
           "GFLOP/s");
  }
  if (wanted("elementwise_gpu")) {
    const int64_t n = 16 << 20; // 64 MiB of float32 per operand
    auto x = af::tensor::filled(af::dtype::float32, {n}, 1);
    auto secs = time_of(ls.add(ls.constant(x), ls.constant(x)));
    // bytes moved by the op: two inputs read, one output written
    report("elementwise_gpu", 3.0 * x.nbytes() / 1e9 / secs,
           af::kernels::cuda_copy_gbps(2 * x.nbytes(), reps) , "GB/s");
  }
  return 0;
}

int local_read_rtt(ps_bench& c) {
  auto& opts = c.opts;
  auto rounds = c.rounds;
  // A session in the same actor system as its node, against a bare CAF
  // request/response between two actors of one system.
  auto local = ok(af::embedded_cluster::start({{"local", 1}}, opts), "embedded node");
  auto& lsys = local->system("local", 0);
  std::vector<double> ours, base;
  {
    auto ls = ok(local->session_for("local", 0), "local session");
    auto v = ok(ls.variable("x", {}, af::initializer::ones()), "variable");
    if (auto err = ls.initialize({v}))
      return std::cerr << af::describe(err) << std::endl, 1;
    auto echo = lsys.spawn(echo_impl);
    caf::scoped_actor self{lsys, true};
    for (int i = 0; i < rounds + 100; ++i) {
      auto t0 = clock_type::now();
      ok(ls.run(v), "local read");
      auto t1 = clock_type::now();
      self->request(echo, std::chrono::seconds(10), caf::ping_atom::value, int64_t{i})
        .receive([](int64_t) {}, [](caf::error&) {});
      auto t2 = clock_type::now();
      if (i >= 100) {
        ours.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        base.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
    }
    caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  }
  report("local_read_rtt", median(ours), median(base), "us");
  return 0;
}

} // namespace


/// The metrics of one ps node against a raw peer, and of local actors: each
/// wanted one prints its line. Forks the raw peer first: call it before any
/// thread exists.
int core_benches(const std::function<bool(const std::string&)>& wanted, af::node_options opts,
                 const std::string& transport, int rounds, int reps, int poll_us) {
  raw_link raw;
  raw.start(); // fork before any thread exists
  af::tune_malloc_for_tensors();
  auto spec = ok(af::cluster_spec::from_jobs({{"ps", {"127.0.0.1:" + std::to_string(af::free_loopback_port())}},
                                              {"worker", {"127.0.0.1:" + std::to_string(af::free_loopback_port())}}}),
                 "cluster");
  node_process ps;
  ps.start(spec, opts);
  af::system_config cfg{opts};
  auto sys_owner = af::start_actor_system(cfg);
  caf::actor_system& sys = *sys_owner;
  af::session_options sopts;
  sopts.timeout = std::chrono::seconds(60);
  sopts.data_plane = transport == "data-plane";
  sopts.reply_poll = std::chrono::microseconds{poll_us};
  auto s = ok(af::session::make(sys, spec, "/job:worker/task:0", sopts), "session");
  if (auto err = s.wait_for_node("ps", 0, std::chrono::seconds(10))) {
    std::cerr << "actorflow-bench: the ps node did not come up: " << af::describe(err) << std::endl;
    return 1;
  }
  auto scope = ok(s.device("/job:ps/task:0"), "device");
  std::printf("# actorflow-bench: client and ps in separate processes on loopback; transport %s; "
              "scheduler %s x%zu\n",
              transport.c_str(), opts.scheduler.c_str(), cfg.threads());

  ps_bench c{wanted, opts, rounds, reps, raw, ps, sys, spec, sopts, s};
  if (wanted("remote_assign_add_rtt"))
    if (int rc = remote_assign_add_rtt(c))
      return rc;
  if (wanted("tensor_64mib_assign") || wanted("tensor_64mib_read") || wanted("node_rss_64mib"))
    if (int rc = tensor_64mib(c))
      return rc;
  if (wanted("fanin_8x4mib"))
    if (int rc = fanin_8x4mib(c))
      return rc;
  if (wanted("gemm_2048_cpu"))
    if (int rc = gemm_2048_cpu(c))
      return rc;
  if (wanted("nonfinite_check_1m"))
    if (int rc = nonfinite_check_1m(c))
      return rc;

  bool gpu_metrics = wanted("gemm_4096_gpu") || wanted("elementwise_gpu");
  if (gpu_metrics && af::kernels::cuda_device_count() == 0) {
    std::string why;
    af::kernels::cuda_device_count(&why);
    std::printf("# gemm_4096_gpu, elementwise_gpu: skipped (%s)\n", why.c_str());
    if (int rc = gpu_benches(c))
      return rc;
  }
  if (wanted("local_read_rtt"))
    if (int rc = local_read_rtt(c))
      return rc;
  return 0;
}

} // namespace af::bench
