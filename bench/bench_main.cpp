// actorflow-bench: actorflow's figures against the raw socket, in one run.
// Each line: metric NAME ours=X baseline=Y unit=U ratio=Z  (ratio = ours/baseline).
// The ps is a real actorflow-node process; the baseline is a forked process
// speaking plain TCP on loopback. Both run now, on this machine, so compare
// ratios, not absolute values.
// The training metrics (bench_train.hpp) run clusters of actorflow-train
// against raw-TCP parameter servers. `--only a,b` runs some metrics.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <openssl/opensslv.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>
#include <vector>

#include <asio.hpp>
#include <CLI/CLI.hpp>
#include <cblas.h>

#include "caf/all.hpp"

#include "net/aes_gcm.hpp"
#include "net/data_plane.hpp"
#include "actors/variable_directory.hpp"
#include "dist/embedded_cluster.hpp"
#include "net/tls.hpp"
#include "actors/variable.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "config/cluster_spec.hpp"
#include "config/loopback.hpp"
#include "kernels/kernels.hpp"
#include "messages/error.hpp"
#include "programs/bench_activation.hpp"
#include "programs/bench_train.hpp"
#include "programs/last_resort.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

void report(const std::string& name, double ours, double baseline, const char* unit) {
  std::printf("metric %s ours=%.3f baseline=%.3f unit=%s ratio=%.3f\n", name.c_str(), ours, baseline,
              unit, ours / baseline);
  std::fflush(stdout);
}

// -- raw TCP peer ---------------------------------------------------------------

bool full_io(int fd, void* buf, size_t n, bool write_it) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    auto r = write_it ? ::write(fd, p, n) : ::read(fd, p, n);
    if (r <= 0)
      return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// Serves commands {op, count, size} on one connection until it closes.
void raw_serve(int fd) {
  set_nodelay(fd);
  std::vector<char> buf(1 << 20);
  std::vector<char> whole; // 'W' and 'R': one buffer of the transfer's size, kept
  struct { char op; uint64_t count; uint64_t size; } cmd;
  while (full_io(fd, &cmd, sizeof(cmd), false)) {
    if (cmd.op == 'p') {
      for (uint64_t i = 0; i < cmd.count; ++i)
        if (!full_io(fd, buf.data(), cmd.size, false) || !full_io(fd, buf.data(), cmd.size, true))
          _exit(1);
    } else if (cmd.op == 'w') { // parent writes size bytes, we ack
      for (uint64_t left = cmd.size; left > 0;) {
        auto r = ::read(fd, buf.data(), std::min<uint64_t>(left, buf.size()));
        if (r <= 0)
          _exit(1);
        left -= static_cast<uint64_t>(r);
      }
      char ack = 1;
      full_io(fd, &ack, 1, true);
    } else if (cmd.op == 'r') { // we write size bytes
      for (uint64_t left = cmd.size; left > 0;) {
        auto n = std::min<uint64_t>(left, buf.size());
        if (!full_io(fd, buf.data(), n, true))
          _exit(1);
        left -= n;
      }
    } else if (cmd.op == 'W' || cmd.op == 'R') {
      // Buffer to buffer: the whole transfer lands in (or leaves from) one
      // buffer of its size, allocated once and pre-faulted, as a tensor's
      // bytes would; 'W': we receive and ack, 'R': we send.
      if (whole.size() != cmd.size)
        whole.assign(cmd.size, 'b');
      if (!full_io(fd, whole.data(), whole.size(), cmd.op == 'R'))
        _exit(1);
      if (cmd.op == 'W') {
        char ack = 1;
        full_io(fd, &ack, 1, true);
      }
    }
  }
  close(fd);
}

/// The child: a thread per connection; exits when the first connection (the
/// parent's control link) closes.
[[noreturn]] void raw_peer(int listen_fd) {
  int first = accept(listen_fd, nullptr, nullptr);
  std::thread{[listen_fd] {
    for (;;) {
      int fd = accept(listen_fd, nullptr, nullptr);
      if (fd < 0)
        return;
      std::thread{raw_serve, fd}.detach();
    }
  }}.detach();
  raw_serve(first);
  _exit(0);
}

struct raw_link {
  pid_t pid = -1;
  int fd = -1;

  uint16_t port = 0;

  void start() {
    int lfd = af::listen_on_loopback(port, 16);
    pid = fork();
    if (pid == 0)
      raw_peer(lfd);
    close(lfd);
    fd = dial(port);
  }

  static int dial(uint16_t port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    set_nodelay(s);
    return s;
  }

  /// MB/s of `senders` connections each sending `rounds` x `bytes` at once.
  double fanin_mbps(int senders, int rounds, size_t bytes) {
    std::vector<int> fds;
    for (int i = 0; i < senders; ++i)
      fds.push_back(dial(port));
    std::vector<std::thread> threads;
    auto t0 = clock_type::now();
    for (int fdi : fds)
      threads.emplace_back([fdi, rounds, bytes] {
        std::vector<char> buf(bytes, 'g');
        struct { char op; uint64_t count; uint64_t size; } cmd{'w', 1, bytes};
        char ack;
        for (int r = 0; r < rounds; ++r) {
          full_io(fdi, &cmd, sizeof(cmd), true);
          full_io(fdi, buf.data(), bytes, true);
          full_io(fdi, &ack, 1, false);
        }
      });
    for (auto& t : threads)
      t.join();
    auto secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    for (int fdi : fds)
      close(fdi);
    return senders * rounds * (bytes / 1e6) / secs;
  }

  void command(char op, uint64_t count, uint64_t size) {
    struct { char op; uint64_t count; uint64_t size; } cmd{op, count, size};
    full_io(fd, &cmd, sizeof(cmd), true);
  }

  /// Announces `rounds` echoes of `size` bytes; then call echo_us() that often.
  void start_echoes(int rounds, size_t size) {
    echo_buf.resize(size);
    command('p', static_cast<uint64_t>(rounds), size);
  }

  /// One round trip, in microseconds.
  double echo_us() {
    auto t0 = clock_type::now();
    full_io(fd, echo_buf.data(), echo_buf.size(), true);
    full_io(fd, echo_buf.data(), echo_buf.size(), false);
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
  }

  std::vector<char> echo_buf;

  /// MB/s of sending `bytes` (and getting a 1-byte ack) / of receiving them.
  double stream_mbps(size_t bytes, bool upload, std::vector<char>& buf) {
    auto t0 = clock_type::now();
    command(upload ? 'w' : 'r', 1, bytes);
    if (upload) {
      for (size_t off = 0; off < bytes; off += buf.size())
        full_io(fd, buf.data(), std::min(buf.size(), bytes - off), true);
      char ack;
      full_io(fd, &ack, 1, false);
    } else {
      for (size_t off = 0; off < bytes;) {
        auto r = ::read(fd, buf.data(), std::min(buf.size(), bytes - off));
        if (r <= 0)
          break;
        off += static_cast<size_t>(r);
      }
    }
    return bytes / 1e6 / std::chrono::duration<double>(clock_type::now() - t0).count();
  }

  /// MB/s of one buffer-to-buffer transfer of `buf` (pre-faulted by the
  /// caller, reused): upload = ours to the peer's buffer and its ack, else the
  /// peer's buffer into ours. The fair baseline for a tensor, which also
  /// lands in one buffer of its size (issue 12, part 3).
  double buffer_mbps(std::vector<char>& whole, bool upload) {
    auto t0 = clock_type::now();
    command(upload ? 'W' : 'R', 1, whole.size());
    full_io(fd, whole.data(), whole.size(), upload);
    if (upload) {
      char ack;
      full_io(fd, &ack, 1, false);
    }
    return whole.size() / 1e6 / std::chrono::duration<double>(clock_type::now() - t0).count();
  }

  ~raw_link() {
    if (fd >= 0)
      close(fd);
    if (pid > 0)
      waitpid(pid, nullptr, 0);
  }
};

/// One variable op on a data channel; a failure ends the bench with its
/// reason. The value that came back.
af::tensor call(af::data_channel& ch, af::var_op op, const char* name, const af::tensor* operand) {
  auto r = ch.call(op, name, operand, false);
  if (!r) {
    std::cerr << "actorflow-bench: " << af::describe(r.error()) << std::endl;
    std::exit(1);
  }
  return std::move(r->first);
}

/// Round trips of `op` against the raw TCP echo of 64 bytes, in alternating
/// blocks of 100 so that each side runs in its steady state (the first
/// block of each is a warm-up): the medians, in us.
template <class Op>
std::pair<double, double> rtt_against_echo(raw_link& raw, int rounds, Op op) {
  std::vector<double> ours, base;
  const int block = 100, blocks = std::max(1, rounds / block) + 1;
  raw.start_echoes(blocks * block, 64);
  for (int b = 0; b < blocks; ++b) {
    for (int i = 0; i < block; ++i) {
      auto t0 = clock_type::now();
      op();
      if (b > 0)
        ours.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    for (int i = 0; i < block; ++i) {
      auto us = raw.echo_us();
      if (b > 0)
        base.push_back(us);
    }
  }
  return {median(ours), median(base)};
}

// -- the ps node -------------------------------------------------------------------

struct node_process {
  pid_t pid = -1;
  std::string config;

  bool start(const af::cluster_spec& spec, const af::node_options& opts) {
    config = "/tmp/actorflow-bench-" + std::to_string(getpid()) + ".toml";
    std::ofstream{config} << spec.to_toml(opts);
    auto self = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "actorflow-node";
    pid = fork();
    if (pid == 0) {
      execl(self.c_str(), self.c_str(), "--config", config.c_str(), "--job", "ps", "--task", "0",
            static_cast<char*>(nullptr));
      std::perror("exec actorflow-node");
      _exit(127);
    }
    return pid > 0;
  }

  ~node_process() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
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

/// MB/s of one memcpy of `src` into `dst` (same size, both allocated once
/// and pre-faulted by the caller): what one core of this machine moves in one
/// process, the ceiling of a shared-memory path.
double memcpy_mbps(std::vector<char>& dst, const std::vector<char>& src) {
  auto t0 = clock_type::now();
  std::memcpy(dst.data(), src.data(), src.size());
  auto secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  asm volatile("" : : "r"(dst.data()) : "memory"); // the copy is not optimized away
  return src.size() / 1e6 / secs;
}

/// A bare CAF actor answering ping: the local request/response baseline.
caf::behavior echo_impl() {
  return {[](caf::ping_atom, int64_t x) { return x; }};
}

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

template <class T>
T ok(caf::expected<T> x, const char* what) {
  if (!x) {
    std::cerr << "actorflow-bench: " << what << ": " << af::describe(x.error()) << std::endl;
    std::exit(1);
  }
  return std::move(*x);
}

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
  caf::actor_system sys{cfg};
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

  if (wanted("remote_assign_add_rtt")) {
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
  }

  if (wanted("tensor_64mib_assign") || wanted("tensor_64mib_read") || wanted("node_rss_64mib")) {
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
  }

  if (wanted("fanin_8x4mib")) {
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
  }

  if (wanted("gemm_2048_cpu")) {
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
  }

  bool gpu_metrics = wanted("gemm_4096_gpu") || wanted("elementwise_gpu");
  if (gpu_metrics && af::kernels::cuda_device_count() == 0) {
    std::string why;
    af::kernels::cuda_device_count(&why);
    std::printf("# gemm_4096_gpu, elementwise_gpu: skipped (%s)\n", why.c_str());
  } else if (gpu_metrics) {
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
  }

  if (wanted("local_read_rtt")) {
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
  }
  return 0;
}

} // namespace

// -- the event loop question (docs/wire.md): an Asio prototype ---------------
//
// The same frames served by one thread running an asio::io_context instead
// of one thread per connection: variable ops only (read, assign, assign_add,
// assign_sub), no TLS, no aggregators, no limits, no timeouts. Enough to
// measure what an event loop costs or saves against today's server.

class asio_conn : public std::enable_shared_from_this<asio_conn> {
public:
  asio_conn(asio::ip::tcp::socket sock, std::shared_ptr<af::variable_directory> dir)
    : sock_(std::move(sock)), dir_(std::move(dir)) {
    sock_.set_option(asio::ip::tcp::no_delay(true));
  }
  void start() { read_header(); }

private:
  void read_header() {
    asio::async_read(sock_, asio::buffer(&h_, sizeof(h_)),
                     [self = shared_from_this()](std::error_code ec, size_t) {
                       if (!ec)
                         self->on_header();
                     });
  }
  void on_header() {
    if (!af::wire::validate(h_).empty() || !af::valid_var_op(h_.kind))
      return; // the prototype just hangs up
    name_.resize(h_.name_len);
    asio::async_read(sock_, asio::buffer(name_), [self = shared_from_this()](std::error_code ec, size_t) {
      if (!ec)
        self->on_name();
    });
  }
  void on_name() {
    cell_ = dir_->get(name_).cell;
    if (!cell_)
      return;
    operand_ = af::tensor{};
    if (!h_.has_tensor || h_.payload_bytes == 0)
      return apply();
    operand_.reset(static_cast<af::dtype>(h_.dtype), af::wire::shape_of(h_));
    asio::async_read(sock_, asio::buffer(operand_.mutable_bytes(), h_.payload_bytes),
                     [self = shared_from_this()](std::error_code ec, size_t) {
                       if (!ec)
                         self->apply();
                     });
  }
  void apply() {
    auto r = cell_->apply(static_cast<af::var_op>(h_.kind), operand_, h_.want_value != 0);
    if (!r)
      return;
    reply_ = af::wire::header{};
    reply_.kind = static_cast<uint8_t>(af::wire::kind::reply);
    reply_.version = r->version;
    value_ = std::move(r->value);
    std::vector<asio::const_buffer> out{asio::buffer(&reply_, sizeof(reply_))};
    if (!value_.empty() && af::wire::describe_tensor(value_, reply_))
      out.push_back(asio::buffer(value_.bytes(), value_.nbytes()));
    asio::async_write(sock_, out, [self = shared_from_this()](std::error_code ec, size_t) {
      if (!ec)
        self->read_header();
    });
  }

  asio::ip::tcp::socket sock_;
  std::shared_ptr<af::variable_directory> dir_;
  af::wire::header h_;
  std::string name_;
  std::shared_ptr<af::variable_cell> cell_;
  af::tensor operand_;
  af::wire::header reply_;
  af::tensor value_;
};

struct asio_server {
  asio::io_context io{1};
  asio::ip::tcp::acceptor acceptor{io, {asio::ip::make_address("127.0.0.1"), 0}};
  std::shared_ptr<af::variable_directory> dir;
  std::thread thread;

  explicit asio_server(std::shared_ptr<af::variable_directory> d) : dir(std::move(d)) {
    accept();
    thread = std::thread{[this] { io.run(); }};
  }
  ~asio_server() {
    io.stop();
    thread.join();
  }
  uint16_t port() const { return acceptor.local_endpoint().port(); }
  void accept() {
    acceptor.async_accept([this](std::error_code ec, asio::ip::tcp::socket sock) {
      if (!ec)
        std::make_shared<asio_conn>(std::move(sock), dir)->start();
      accept();
    });
  }
};

// -- the data plane with and without TLS (issue 11) ----------------------------
//
// A forked process serves one plaintext and one TLS data plane (the same
// variables); this process is the client. Each figure is TLS against the
// same op without TLS, measured alternately in the same run.

/// A CA and one certificate for both ends, made with the openssl command line
/// in a fresh folder; empty if that failed.
std::string make_bench_certs() {
  char tmpl[] = "/tmp/actorflow-bench-certs-XXXXXX";
  if (mkdtemp(tmpl) == nullptr)
    return {};
  std::string d = tmpl;
  auto run = [](const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; };
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
  if (!run("openssl req -x509" + ec + "-keyout " + d + "/ca.key -out " + d + "/ca.pem -days 2 -subj /CN=bench-ca")
      || !run("openssl req" + ec + "-keyout " + d + "/node.key -out " + d
              + "/node.csr -subj /CN=node -addext subjectAltName=IP:127.0.0.1")
      // The data plane checks that the node's certificate names the host dialled.
      || !run("openssl x509 -req -in " + d + "/node.csr -CA " + d + "/ca.pem -CAkey " + d
              + "/ca.key -CAcreateserial -copy_extensions copy -out " + d + "/node.pem -days 2"))
    return {};
  return d;
}

int tls_benches(const std::function<bool(const std::string&)>& wanted, int rounds, int reps,
                int poll_us) {
  bool event_loop = wanted("event_loop_prototype");
  auto dir = make_bench_certs();
  if (dir.empty()) {
    std::printf("# tls benches skipped: the openssl command line could not make certificates\n");
    return 0;
  }
  af::security_options sec;
  sec.ca_file = dir + "/ca.pem";
  sec.cert_file = dir + "/node.pem";
  sec.key_file = dir + "/node.key";
  const int64_t n = 16 << 20; // 64 MiB of float32
  int ports[2];
  if (pipe(ports) != 0)
    return 1;
  int stop[2];
  if (pipe(stop) != 0)
    return 1;
  pid_t child = fork();
  if (child == 0) {
    close(ports[0]);
    close(stop[1]);
    auto tls = af::make_tls_context(sec, "bench node");
    if (!tls)
      _exit(3);
    auto d = std::make_shared<af::variable_directory>();
    auto spec_big = af::variable_spec{"big", af::dtype::float32, {n}, "/job:ps/replica:0/task:0/device:CPU:0"};
    auto spec_counter = af::variable_spec{"counter", af::dtype::float32, {}, "/job:ps/replica:0/task:0/device:CPU:0"};
    auto big = std::make_shared<af::variable_cell>(spec_big);
    auto counter = std::make_shared<af::variable_cell>(spec_counter);
    if (!big->initialize(af::initializer::zeros(), false, "")
        || !counter->initialize(af::initializer::zeros(), false, ""))
      _exit(4);
    d->put("big", {af::variable_cell_actor{}, big});
    d->put("counter", {af::variable_cell_actor{}, counter});
    auto plain = af::data_plane_server::start(d, "127.0.0.1", 0, "bench node", {});
    auto secure = af::data_plane_server::start(d, "127.0.0.1", 0, "bench node", {}, *tls);
    if (!plain || !secure)
      _exit(5);
    std::unique_ptr<asio_server> loop;
    if (event_loop)
      loop = std::make_unique<asio_server>(d);
    uint16_t p[3] = {(*plain)->port(), (*secure)->port(), loop ? loop->port() : uint16_t{0}};
    if (write(ports[1], p, sizeof(p)) != sizeof(p))
      _exit(6);
    char byte;
    while (read(stop[0], &byte, 1) > 0) {
    } // until the parent closes its end
    (*plain)->stop();
    (*secure)->stop();
    _exit(0);
  }
  close(ports[1]);
  close(stop[0]);
  uint16_t p[3] = {0, 0, 0};
  bool up = read(ports[0], p, sizeof(p)) == sizeof(p);
  close(ports[0]);
  auto finish = [&](int rc) {
    close(stop[1]);
    int status = 0;
    waitpid(child, &status, 0);
    std::filesystem::remove_all(dir);
    return rc;
  };
  if (!up) {
    std::cerr << "actorflow-bench: the TLS bench's server did not start" << std::endl;
    return finish(1);
  }
  auto tls = af::make_tls_context(sec, "bench client");
  if (!tls) {
    std::cerr << "actorflow-bench: " << af::describe(tls.error()) << std::endl;
    return finish(1);
  }
  auto poll = std::chrono::microseconds{poll_us};
  // TCP, not shared memory (this host's default), for the plaintext baseline:
  // TLS connections never take shared memory, and the event-loop figures
  // compare TCP servers.
  auto plain = af::data_channel::connect("127.0.0.1", p[0], "bench node (plaintext)",
                                         std::chrono::seconds(60), poll, nullptr, nullptr, false);
  auto secure = af::data_channel::connect("127.0.0.1", p[1], "bench node (TLS)",
                                          std::chrono::seconds(60), poll, *tls);
  if (!plain || !secure) {
    std::cerr << "actorflow-bench: " << af::describe(!plain ? plain.error() : secure.error()) << std::endl;
    return finish(1);
  }
  std::printf("# tls: client and data-plane server in separate processes on loopback; %s (%s); "
              "records' AES-128-GCM by %s (ACTORFLOW_AES_GCM=openssl for OpenSSL's); the same op "
              "without TLS is the baseline\n",
              (*secure)->tls_description().c_str(), OPENSSL_VERSION_TEXT,
              af::aes_gcm::describe(af::aes_gcm::best()).c_str());
  if (wanted("remote_assign_add_rtt_tls")) {
    auto one = af::tensor::scalar(1);
    std::vector<double> ours, base;
    const int block = 100, blocks = std::max(1, rounds / block) + 1; // the first: warm-up
    for (int b = 0; b < blocks; ++b)
      for (auto* ch : {secure->get(), plain->get()})
        for (int i = 0; i < block; ++i) {
          auto t0 = clock_type::now();
          call(*ch, af::var_op::assign_add, "counter", &one);
          auto us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
          if (b > 0)
            (ch == secure->get() ? ours : base).push_back(us);
        }
    report("remote_assign_add_rtt_tls", median(ours), median(base), "us");
  }
  if (wanted("tensor_64mib_assign_tls")) {
    auto value = af::tensor::filled(af::dtype::float32, {n}, 1);
    auto mbps = [&](af::data_channel& ch) {
      auto t0 = clock_type::now();
      call(ch, af::var_op::assign, "big", &value);
      return value.nbytes() / 1e6 / std::chrono::duration<double>(clock_type::now() - t0).count();
    };
    // CPU time of both processes (client: this one; server: the child), so
    // that on a busy machine the cost can be told from the waiting.
    auto client_ms = [] {
      rusage self{};
      getrusage(RUSAGE_SELF, &self);
      auto tv_ms = [](const timeval& tv) { return tv.tv_sec * 1e3 + tv.tv_usec / 1e3; };
      return tv_ms(self.ru_utime) + tv_ms(self.ru_stime);
    };
    auto cpu_ms = [&] {
      double ms = client_ms();
      std::ifstream stat{"/proc/" + std::to_string(child) + "/stat"};
      std::string line;
      std::getline(stat, line);
      auto close_paren = line.rfind(')');
      std::istringstream fields{close_paren == std::string::npos ? "" : line.substr(close_paren + 2)};
      std::string field;
      double ticks = 0;
      for (int i = 3; fields >> field; ++i)
        if (i == 14 || i == 15)
          ticks += std::stod(field);
      return ms + ticks * 1e3 / static_cast<double>(sysconf(_SC_CLK_TCK));
    };
    mbps(**secure); // warm both ends
    mbps(**plain);
    std::vector<double> ours, base;
    double cpu_tls = 0, cpu_plain = 0, client_tls = 0, client_plain = 0;
    for (int i = 0; i < reps; ++i) {
      auto c0 = cpu_ms(), s0 = client_ms();
      ours.push_back(mbps(**secure));
      auto c1 = cpu_ms(), s1 = client_ms();
      base.push_back(mbps(**plain));
      auto c2 = cpu_ms(), s2 = client_ms();
      cpu_tls += c1 - c0;
      cpu_plain += c2 - c1;
      client_tls += s1 - s0;
      client_plain += s2 - s1;
    }
    // The wall time next to the CPU time says how much the two ends overlap
    // (on 2 cores, wall = CPU / 2 at best).
    std::printf("# tensor_64mib_assign_tls: CPU per assign, client + server: TLS %.0f + %.0f ms "
                "(wall %.0f ms), plaintext %.0f + %.0f ms (wall %.0f ms); CPU ratio %.2f\n",
                client_tls / reps, (cpu_tls - client_tls) / reps, value.nbytes() / 1e3 / median(ours),
                client_plain / reps, (cpu_plain - client_plain) / reps,
                value.nbytes() / 1e3 / median(base), cpu_plain / std::max(cpu_tls, 1e-9));
    report("tensor_64mib_assign_tls", median(ours), median(base), "MB/s");
  }
  if (event_loop) {
    // Today's server (a thread per connection) against the Asio prototype
    // (one io_context thread), the same frames and client. ours = Asio.
    auto loop = af::data_channel::connect("127.0.0.1", p[2], "bench node (asio)",
                                          std::chrono::seconds(60), poll, nullptr, nullptr, false);
    if (!loop) {
      std::cerr << "actorflow-bench: " << af::describe(loop.error()) << std::endl;
      return finish(1);
    }
    auto one = af::tensor::scalar(1);
    std::vector<double> ours, base;
    const int block = 100, blocks = std::max(1, rounds / block) + 1;
    for (int b = 0; b < blocks; ++b)
      for (auto* ch : {loop->get(), plain->get()})
        for (int i = 0; i < block; ++i) {
          auto t0 = clock_type::now();
          call(*ch, af::var_op::assign_add, "counter", &one);
          auto us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
          if (b > 0)
            (ch == loop->get() ? ours : base).push_back(us);
        }
    report("event_loop_assign_add_rtt", median(ours), median(base), "us");
    auto value = af::tensor::filled(af::dtype::float32, {n}, 1);
    auto mbps = [&](af::data_channel& ch) {
      auto t0 = clock_type::now();
      call(ch, af::var_op::assign, "big", &value);
      return value.nbytes() / 1e6 / std::chrono::duration<double>(clock_type::now() - t0).count();
    };
    mbps(**loop);
    mbps(**plain);
    std::vector<double> ours_w, base_w;
    for (int i = 0; i < reps; ++i) {
      ours_w.push_back(mbps(**loop));
      base_w.push_back(mbps(**plain));
    }
    report("event_loop_64mib_assign", median(ours_w), median(base_w), "MB/s");
    // Many clients at once: 8 connections, each a closed loop of round trips
    // from its own thread; the figure is the total op rate.
    auto rate = [&](uint16_t port) {
      std::vector<std::unique_ptr<af::data_channel>> chans;
      for (int i = 0; i < 8; ++i)
        chans.push_back(std::move(*af::data_channel::connect("127.0.0.1", port, "bench node",
                                                               std::chrono::seconds(60), poll,
                                                               nullptr, nullptr, false)));
      std::atomic<long> ops{0};
      auto until = clock_type::now() + std::chrono::milliseconds(1000);
      std::vector<std::thread> ts;
      for (auto& c : chans)
        ts.emplace_back([&, ch = c.get()] {
          while (clock_type::now() < until) {
            call(*ch, af::var_op::assign_add, "counter", &one);
            ++ops;
          }
        });
      for (auto& t : ts)
        t.join();
      return ops.load() / 1.0;
    };
    std::vector<double> ours_r, base_r;
    for (int i = 0; i < 3; ++i) {
      ours_r.push_back(rate(p[2]));
      base_r.push_back(rate(p[0]));
    }
    report("event_loop_8_clients_ops", median(ours_r), median(base_r), "ops/s");
    loop->reset();
  }
  plain->reset();
  secure->reset();
  return finish(0);
}

// -- shared memory between processes of one host (issue 12) --------------------
//
// A forked process serves a data plane; this process is its client twice:
// one channel that moved to shared memory (the default for a node on this
// host), one kept on TCP. The baselines are the raw TCP transfer buffer to
// buffer, one memcpy of the same bytes, and the raw TCP ping-pong.

int shm_benches(const std::function<bool(const std::string&)>& wanted, int rounds, int reps,
                int poll_us) {
  raw_link raw;
  raw.start(); // fork before any thread exists
  const int64_t n = 16 << 20; // 64 MiB of float32
  int ports[2];
  int stop[2];
  if (pipe(ports) != 0 || pipe(stop) != 0)
    return 1;
  pid_t child = fork();
  if (child == 0) {
    close(ports[0]);
    close(stop[1]);
    close(raw.fd);
    raw.fd = -1;
    raw.pid = -1;
    af::tune_malloc_for_tensors();
    auto d = std::make_shared<af::variable_directory>();
    auto dev = "/job:ps/replica:0/task:0/device:CPU:0";
    auto big = std::make_shared<af::variable_cell>(af::variable_spec{"big", af::dtype::float32, {n}, dev});
    auto counter = std::make_shared<af::variable_cell>(af::variable_spec{"counter", af::dtype::float32, {}, dev});
    if (!big->initialize(af::initializer::zeros(), false, "")
        || !counter->initialize(af::initializer::zeros(), false, ""))
      _exit(4);
    d->put("big", {af::variable_cell_actor{}, big});
    d->put("counter", {af::variable_cell_actor{}, counter});
    af::data_plane_limits limits;
    limits.trusted_fabric = true; // takes the 'ucx' channel's offer (no other channel makes one)
    auto srv = af::data_plane_server::start(d, "127.0.0.1", 0, "bench node", limits);
    if (!srv)
      _exit(5);
    uint16_t p = (*srv)->port();
    if (write(ports[1], &p, sizeof(p)) != sizeof(p))
      _exit(6);
    char byte;
    while (read(stop[0], &byte, 1) > 0) {
    } // until the parent closes its end
    (*srv)->stop();
    _exit(0);
  }
  close(ports[1]);
  close(stop[0]);
  uint16_t port = 0;
  bool up = read(ports[0], &port, sizeof(port)) == sizeof(port);
  close(ports[0]);
  auto finish = [&](int rc) {
    close(stop[1]);
    waitpid(child, nullptr, 0);
    return rc;
  };
  if (!up) {
    std::cerr << "actorflow-bench: the shared-memory bench's server did not start" << std::endl;
    return finish(1);
  }
  af::tune_malloc_for_tensors();
  auto poll = std::chrono::microseconds{poll_us};
  auto local = af::data_channel::connect("127.0.0.1", port, "bench node (local)",
                                         std::chrono::seconds(60), poll);
  auto tcp = af::data_channel::connect("127.0.0.1", port, "bench node (tcp)",
                                       std::chrono::seconds(60), poll, nullptr, nullptr, false);
  if (!local || !tcp) {
    std::cerr << "actorflow-bench: " << af::describe(!local ? local.error() : tcp.error()) << std::endl;
    return finish(1);
  }
  auto one = af::tensor::scalar(1);
  call(**local, af::var_op::assign_add, "counter", &one); // the node's first answer...
  call(**local, af::var_op::assign_add, "counter", &one); // ...and the move to shared memory
  std::printf("# local: client and data-plane server in separate processes of this host; the "
              "'local' channel is on %s, the other on %s\n",
              (*local)->transport().c_str(), (*tcp)->transport().c_str());
  if ((*local)->transport() != "shared memory") {
    std::cerr << "actorflow-bench: the local channel did not move to shared memory" << std::endl;
    return finish(1);
  }
  // UCX as between hosts of a trusted fabric (net/ucx_link.hpp), forced
  // on this host; UCX_TLS=tcp in the environment (both processes) keeps it
  // on UCX's TCP transport, as between hosts without RDMA.
  std::unique_ptr<af::data_channel> ucx;
  bool ucx_wanted = wanted("tensor_64mib_assign_ucx") || wanted("remote_assign_add_rtt_ucx");
  if (ucx_wanted && !af::ucx_channel::available())
    std::printf("# ucx: the ucx metrics skipped: this build or process has no UCX\n");
  else if (ucx_wanted) {
    setenv("ACTORFLOW_DATA_UCX", "force", 1);
    auto c = af::data_channel::connect("127.0.0.1", port, "bench node (ucx)", std::chrono::seconds(60),
                                       poll, nullptr, nullptr, false, true);
    if (c) {
      call(**c, af::var_op::assign_add, "counter", &one);
      call(**c, af::var_op::assign_add, "counter", &one);
      ucx = std::move(*c);
    }
    if (!ucx || ucx->transport().rfind("ucx", 0) != 0) {
      std::cerr << "actorflow-bench: no UCX channel ("
                << (ucx ? ucx->transport() : af::describe(c.error()))
                << "); is the build without libucx-dev?" << std::endl;
      return finish(1);
    }
    std::printf("# ucx: the 'ucx' channel is on %s\n", ucx->transport().c_str());
  }
  if (wanted("remote_assign_add_rtt_local")) {
    auto [ours, base] = rtt_against_echo(
      raw, rounds, [&] { call(**local, af::var_op::assign_add, "counter", &one); });
    report("remote_assign_add_rtt_local", ours, base, "us");
  }
  if (ucx && wanted("remote_assign_add_rtt_ucx")) {
    auto [ours, base] = rtt_against_echo(
      raw, rounds, [&] { call(*ucx, af::var_op::assign_add, "counter", &one); });
    report("remote_assign_add_rtt_ucx", ours, base, "us");
  }
  bool assign = wanted("tensor_64mib_assign_local"), read = wanted("tensor_64mib_read_local");
  bool ucx_big = ucx && wanted("tensor_64mib_assign_ucx");
  if (assign || read || ucx_big) {
    auto value = af::tensor::filled(af::dtype::float32, {n}, 1);
    std::vector<char> whole(value.nbytes(), 'w'), copy(value.nbytes(), 'c');
    auto mbps = [&](auto&& f) {
      auto t0 = clock_type::now();
      f();
      return value.nbytes() / 1e6 / std::chrono::duration<double>(clock_type::now() - t0).count();
    };
    raw.buffer_mbps(whole, true); // the peer allocates and faults its buffer
    if (ucx_big) {
      call(*ucx, af::var_op::assign, "big", &value);
      call(*ucx, af::var_op::read, "big", nullptr);
    }
    for (auto* ch : {local->get(), tcp->get()}) { // warm both ends
      call(*ch, af::var_op::assign, "big", &value);
      call(*ch, af::var_op::read, "big", nullptr);
    }
    std::vector<double> shm_w, shm_r, tcp_w, tcp_r, b2b_w, b2b_r, copies, ucx_w;
    for (int i = 0; i < reps; ++i) {
      if (ucx_big) {
        ucx_w.push_back(mbps([&] { call(*ucx, af::var_op::assign, "big", &value); }));
        if (!assign) {
          tcp_w.push_back(mbps([&] { call(**tcp, af::var_op::assign, "big", &value); }));
          b2b_w.push_back(raw.buffer_mbps(whole, true));
        }
      }
      if (assign) {
        shm_w.push_back(mbps([&] { call(**local, af::var_op::assign, "big", &value); }));
        tcp_w.push_back(mbps([&] { call(**tcp, af::var_op::assign, "big", &value); }));
        b2b_w.push_back(raw.buffer_mbps(whole, true));
      }
      if (read) {
        shm_r.push_back(mbps([&] { call(**local, af::var_op::read, "big", nullptr); }));
        tcp_r.push_back(mbps([&] { call(**tcp, af::var_op::read, "big", nullptr); }));
        b2b_r.push_back(raw.buffer_mbps(whole, false));
      }
      copies.push_back(memcpy_mbps(copy, whole));
    }
    if (ucx_big) {
      report("tensor_64mib_assign_ucx", median(ucx_w), median(b2b_w), "MB/s");
      report("tensor_64mib_assign_ucx_vs_tcp", median(ucx_w), median(tcp_w), "MB/s");
    }
    if (assign) {
      report("tensor_64mib_assign_local", median(shm_w), median(b2b_w), "MB/s");
      report("tensor_64mib_assign_local_vs_memcpy", median(shm_w), median(copies), "MB/s");
      report("tensor_64mib_assign_tcp_vs_b2b", median(tcp_w), median(b2b_w), "MB/s");
    }
    if (read) {
      report("tensor_64mib_read_local", median(shm_r), median(b2b_r), "MB/s");
      report("tensor_64mib_read_local_vs_memcpy", median(shm_r), median(copies), "MB/s");
      report("tensor_64mib_read_tcp_vs_b2b", median(tcp_r), median(b2b_r), "MB/s");
    }
  }
  ucx.reset();
  local->reset();
  tcp->reset();
  return finish(0);
}

static int main_body(int argc, char** argv) {
  // The training metrics' helper processes are this binary, re-executed.
  if (int rc = af::bench::run_helper(argc, argv); rc >= 0)
    return rc;
  CLI::App app{"actorflow-bench: actorflow against the raw socket, measured in the same run"};
  const std::vector<std::string> core_metrics{
    "remote_assign_add_rtt", "tensor_64mib_assign", "tensor_64mib_read", "fanin_8x4mib",
    "node_rss_64mib",        "local_read_rtt",      "gemm_2048_cpu",     "gemm_4096_gpu",
    "elementwise_gpu"};
  const std::vector<std::string> tls_metrics{"tensor_64mib_assign_tls", "remote_assign_add_rtt_tls",
                                             "event_loop_prototype"};
  const std::vector<std::string> local_metrics{"remote_assign_add_rtt_local",
                                               "tensor_64mib_assign_local", "tensor_64mib_read_local",
                                               "tensor_64mib_assign_ucx", "remote_assign_add_rtt_ucx"};
  std::vector<std::string> all_metrics = core_metrics;
  for (auto& m : tls_metrics)
    all_metrics.push_back(m);
  for (auto& m : local_metrics)
    all_metrics.push_back(m);
  const std::string activation_metric = "model_parallel_64mib_activation";
  all_metrics.push_back(activation_metric);
  for (auto& m : af::bench::train_metrics())
    all_metrics.push_back(m);
  std::string only, only_list;
  int rounds = 2000, reps = 5;
  af::node_options opts;
  app.add_option("-m,--metric", only, "run this metric only")->check(CLI::IsMember(all_metrics));
  app.add_option("--only", only_list, "run these metrics only (comma-separated)");
  af::bench::train_bench_options topts;
  app.add_option("--train-reps", topts.reps, "repetitions of each training metric (median)")
    ->check(CLI::PositiveNumber);
  app.add_option("--train-steps", topts.steps_1m,
                 "sync steps of the 1 M-float model per repetition (async: twice, global)")
    ->check(CLI::PositiveNumber);
  app.add_option("--digits-steps", topts.digits_steps, "sync steps of the digits MLP")
    ->check(CLI::PositiveNumber);
  app.add_option("--allreduce-rounds", topts.allreduce_rounds,
                 "timed all-reduces per repetition")
    ->check(CLI::PositiveNumber);
  int train_timeout_s = 180;
  app.add_option("--train-timeout", train_timeout_s,
                 "seconds one training cluster may run before it is killed")
    ->check(CLI::PositiveNumber);
  app.add_option("--train-set", topts.extra_sets,
                 "key=value passed as --set to every actorflow-train process");
  std::string transport = "data-plane";
  app.add_option("--transport", transport, "how sessions reach remote variables")
    ->check(CLI::IsMember({"data-plane", "basp"}));
  app.add_option("--rounds", rounds, "round trips for the latency figures");
  app.add_option("--reps", reps, "repetitions of each 64 MiB transfer (median)");
  app.add_option("--scheduler", opts.scheduler, "CAF scheduler policy of client and node")
    ->check(CLI::IsMember({"sharing", "stealing"}));
  app.add_option("--threads", opts.threads, "scheduler threads of client and node (0 = cores)");
  int poll_us = 50;
  app.add_option("--reply-poll-us", poll_us, "session_options::reply_poll in microseconds");
  // The soak is parsed before CLI11 (run_helper, bench_train.cpp) and must
  // come first; it is listed here so that --help shows it.
  app.footer(
    "Soak (docs/training.md \"The soak\"): sync training, a random task killed with kill -9 "
    "every S seconds\n"
    "  --soak SECONDS        run the soak for SECONDS (must be the first argument)\n"
    "  --soak-interval S     seconds between two faults (default 15)\n"
    "  --soak-checkpoint K   the job checkpoints every K steps (default 50)\n"
    "  --soak-seed N         seed of the choice of the task to kill (default 1)");
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
    if (int rc = tls_benches(wanted, rounds, reps, poll_us))
      return rc;
  if (std::any_of(local_metrics.begin(), local_metrics.end(), wanted))
    if (int rc = shm_benches(wanted, rounds, reps, poll_us))
      return rc;
  // The core metrics are TCP's (and BASP's): their node is on this host, so
  // its data connections would move to shared memory without this.
  const char* user_shm = std::getenv("ACTORFLOW_DATA_SHM");
  std::string saved_shm = user_shm != nullptr ? user_shm : "";
  setenv("ACTORFLOW_DATA_SHM", "off", 1);
  if (std::any_of(core_metrics.begin(), core_metrics.end(), wanted))
    if (int rc = core_benches(wanted, opts, transport, rounds, reps, poll_us))
      return rc;
  if (user_shm != nullptr) // the training metrics' processes get what the user set
    setenv("ACTORFLOW_DATA_SHM", saved_shm.c_str(), 1);
  else
    unsetenv("ACTORFLOW_DATA_SHM");

  // The training metrics start their own processes (fork + exec only).
  std::vector<std::string> train_wanted;
  for (auto& m : af::bench::train_metrics())
    if (wanted(m))
      train_wanted.push_back(m);
  if (!train_wanted.empty())
    af::bench::run_train_benches(train_wanted, topts);

  // Two node processes and a session (programs/bench_activation.hpp); the
  // raw peer is forked first, when this process's actor systems are gone.
  if (wanted(activation_metric)) {
    raw_link raw;
    raw.start();
    std::vector<char> whole(size_t{64} << 20, 'w');
    raw.buffer_mbps(whole, true); // the peer allocates and faults its buffer
    if (int rc = af::bench::run_activation_bench(reps, [&] { return raw.buffer_mbps(whole, true); }))
      return rc;
  }
  return 0;
}

int main(int argc, char** argv) {
  return af::last_resort("actorflow-bench", [&] { return main_body(argc, argv); });
}
