// actorflow-bench's shared-memory metrics (issue 12) and UCX's.
// -- shared memory between processes of one host (issue 12) --------------------
//
// A forked process serves a data plane; this process is its client twice:
// one channel that moved to shared memory (the default for a node on this
// host), one kept on TCP. The baselines are the raw TCP transfer buffer to
// buffer, one memcpy of the same bytes, and the raw TCP ping-pong.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <memory>

#include "actors/system.hpp"
#include "actors/variable.hpp"
#include "bench/benches.hpp"
#include "bench/raw_link.hpp"
#include "net/data_plane.hpp"
#include "net/ucx_link.hpp"

namespace af::bench {

namespace {

using channel = caf::expected<std::unique_ptr<af::data_channel>>;

/// The forked server: a data plane that takes every channel's offer; writes
/// its port to `ports_w` and serves until `stop_r` closes.
[[noreturn]] void serve_shm_bench(int ports_w, int stop_r) {
  const int64_t n = 16 << 20; // 64 MiB of float32
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
  if (write(ports_w, &p, sizeof(p)) != sizeof(p))
    _exit(6);
  char byte;
  while (read(stop_r, &byte, 1) > 0) {
  } // until the parent closes its end
  (*srv)->stop();
  _exit(0);
}

/// The 64 MiB figures: over shared memory (`assign`, `read`) and UCX
/// (`ucx_big`), against TCP, the raw buffer-to-buffer transfer and memcpy.
void tensor_64mib_local(channel& local, channel& tcp, std::unique_ptr<af::data_channel>& ucx,
                        raw_link& raw, int reps, bool assign, bool read, bool ucx_big) {
  const int64_t n = 16 << 20; // 64 MiB of float32
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

} // namespace

int shm_benches(const std::function<bool(const std::string&)>& wanted, int rounds, int reps,
                int poll_us) {
  raw_link raw;
  raw.start(); // fork before any thread exists
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
    serve_shm_bench(ports[1], stop[0]);
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
  if (wanted("remote_assign_add_rtt_channel_tcp")) {
    // remote_assign_add_rtt's op without the session: what the TCP data
    // plane costs alone (the rest of that line's time is the session's).
    auto [ours, base] = rtt_against_echo(
      raw, rounds, [&] { call(**tcp, af::var_op::assign_add, "counter", &one); });
    report("remote_assign_add_rtt_channel_tcp", ours, base, "us");
  }
  if (ucx && wanted("remote_assign_add_rtt_ucx")) {
    auto [ours, base] = rtt_against_echo(
      raw, rounds, [&] { call(*ucx, af::var_op::assign_add, "counter", &one); });
    report("remote_assign_add_rtt_ucx", ours, base, "us");
  }
  bool assign = wanted("tensor_64mib_assign_local"), read = wanted("tensor_64mib_read_local");
  bool ucx_big = ucx && wanted("tensor_64mib_assign_ucx");
  if (assign || read || ucx_big)
    tensor_64mib_local(local, tcp, ucx, raw, reps, assign, read, ucx_big);
  ucx.reset();
  local->reset();
  tcp->reset();
  return finish(0);
}

} // namespace af::bench
