// The helper processes of the training metrics (bench_train.hpp): the raw
// baselines, this binary re-executed with helper_flag (the all-reduce's are
// in allreduce_bench.cpp).
//
// The baselines are written to be as fast as plain sockets allow on one
// machine: persistent connections, TCP_NODELAY, nonblocking sockets driven by
// poll() so that a process sends and receives at once, every buffer allocated
// before the first step, and the parameter server updating and answering
// chunk by chunk as gradients stream in (it starts sending parameters before
// the whole gradient has arrived).
#include "bench/bench_train.hpp"
#include "bench/raw_helpers.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include <cblas.h>

#include "caf/all.hpp"
#include "caf/io/middleman.hpp"

#include "actors/kv_store.hpp"
#include "actors/system.hpp"
#include "bench/train_common.hpp"
#include "config/loopback.hpp"
#include "net/socket.hpp"
#include "train/data.hpp"

namespace af::bench {

namespace {

constexpr size_t chunk_bytes = 64 << 10; // the raw ps's unit of update

// -- sockets (tune_socket, dial_loopback, try_read, try_write: raw_helpers.hpp) --

/// Waits until `out_fd` can take bytes (if `want_out`) or `in_fd` has some
/// (if `want_in`); the same socket may be both. False on an error or after
/// stall_ms without either.
bool wait_sockets(int out_fd, bool want_out, int in_fd, bool want_in) {
  pollfd p[2] = {{out_fd, static_cast<short>(want_out ? POLLOUT : 0), 0},
                 {in_fd, static_cast<short>(want_in ? POLLIN : 0), 0}};
  if (out_fd == in_fd) {
    p[0].events |= p[1].events;
    p[1].fd = -1;
  }
  int r = poll(p, 2, stall_ms);
  if (r == 0)
    std::fprintf(stderr, "bench helper: no progress on its sockets for %d ms\n", stall_ms);
  return r > 0 || (r < 0 && errno == EINTR);
}

/// Sends `out` on the nonblocking socket `out_fd` and receives `in` on
/// `in_fd` (the same socket or another) at once; calls progress(sent,
/// received) whenever either moved. Polls only when neither can move.
template <class Progress>
bool exchange(int out_fd, int in_fd, const void* out, size_t out_n, void* in, size_t in_n,
              Progress&& progress) {
  size_t sent = 0, got = 0;
  while (sent < out_n || got < in_n) {
    bool moved = false;
    if (sent < out_n) {
      auto r = try_write(out_fd, static_cast<const char*>(out), out_n, sent);
      if (r == io::failed)
        return false;
      moved |= r == io::moved;
    }
    if (got < in_n) {
      auto r = try_read(in_fd, static_cast<char*>(in), in_n, got);
      if (r == io::failed)
        return false;
      moved |= r == io::moved;
    }
    if (moved) {
      progress(sent, got);
      continue;
    }
    if (!wait_sockets(out_fd, sent < out_n, in_fd, got < in_n))
      return false;
  }
  return true;
}

/// Bytes of a message of `total` whose first `have` arrived that may be used:
/// whole chunks, or everything once complete (keeps the update loops long).
size_t usable(size_t have, size_t total) {
  return have == total ? total : have - have % chunk_bytes;
}

// -- helper processes ----------------------------------------------------------------

/// The raw-TCP parameter server: accepts `workers` connections on listen-fd,
/// each announcing its rank, then serves steps until the timed window ends
/// (raw_window; it closes every connection) or every worker has closed.
/// sync: the mean of one gradient from each worker is applied (plain SGD,
/// lr), then every worker gets the parameters. async: each gradient is
/// applied as it arrives and answered to its sender. store=1 (the issue's
/// baseline, store-and-forward): a whole gradient (sync: every worker's)
/// arrives before anything of it is applied, and the whole update is done
/// before the parameters go back. store=0 (pipelined): update and answer
/// chunk by chunk as gradients stream in. Prints window_steps and
/// window_seconds.
int raw_ps_main(const helper_args& a) {
  int lfd = static_cast<int>(a.num("listen-fd"));
  auto workers = static_cast<size_t>(a.num("workers"));
  const size_t floats = a.num("floats"), bytes = floats * sizeof(float);
  const bool sync = a.str("mode") == "sync";
  const bool store = a.num("store") != 0;
  const auto lr = static_cast<float>(a.real("lr"));
  raw_window window;
  window.warmup_s = a.real("warmup");
  window.window_s = a.real("window");
  // What of a message of `have` bytes may be applied: whole chunks as they
  // come (pipelined), or nothing until all of it is here (store-and-forward).
  auto ready = [&](size_t have) { return store ? (have == bytes ? bytes : 0) : usable(have, bytes); };
  struct conn {
    int fd = -1;
    std::vector<float> grad;
    size_t received = 0, applied = 0, sent = 0; // bytes of the current step
    uint64_t step = 0;
    bool open = true;
  };
  std::vector<conn> conns(workers);
  for (size_t i = 0; i < workers; ++i) {
    int fd = accept(lfd, nullptr, nullptr);
    uint32_t rank = 0;
    if (fd < 0 || !sock::recv_all(fd, &rank, sizeof(rank)) || rank >= workers || conns[rank].fd >= 0)
      return std::fprintf(stderr, "raw ps: bad worker connection\n"), 1;
    tune_socket(fd);
    conns[rank].fd = fd;
    conns[rank].grad.assign(floats, 0.0f);
  }
  close(lfd);
  std::vector<float> w(floats, 0.0f);
  auto* wbytes = reinterpret_cast<const char*>(w.data());
  uint64_t sync_step = 0, async_steps = 0;
  size_t sync_applied = 0;
  std::vector<pollfd> fds(workers);
  auto any_open = [&] {
    return std::any_of(conns.begin(), conns.end(), [](const conn& c) { return c.open; });
  };
  while (any_open()) {
    window.tick(sync ? sync_step : async_steps,
                std::all_of(conns.begin(), conns.end(), [](const conn& c) { return c.step > 0; }));
    // apply what has arrived
    if (sync) {
      bool all_done = true, all_here = true;
      size_t common = bytes;
      size_t open = 0;
      for (auto& c : conns)
        if (c.open) {
          ++open;
          all_done &= c.step > sync_step;
          all_here &= c.step == sync_step;
          common = std::min(common, c.received);
        }
      if (all_done) {
        ++sync_step;
        sync_applied = 0;
      } else if (all_here) {
        auto target = ready(common);
        if (target > sync_applied) {
          const float scale = lr / static_cast<float>(open);
          size_t lo = sync_applied / sizeof(float), hi = target / sizeof(float);
          for (auto& c : conns)
            if (c.open) {
              const float* g = c.grad.data();
              float* wp = w.data();
              for (size_t k = lo; k < hi; ++k)
                wp[k] -= scale * g[k];
            }
          sync_applied = target;
        }
      }
    } else {
      for (auto& c : conns) {
        auto target = ready(c.received);
        if (c.open && target > c.applied) {
          const float* g = c.grad.data();
          float* wp = w.data();
          for (size_t k = c.applied / sizeof(float), hi = target / sizeof(float); k < hi; ++k)
            wp[k] -= lr * g[k];
          c.applied = target;
        }
      }
    }
    // move bytes
    bool moved = false;
    for (size_t i = 0; i < workers; ++i) {
      auto& c = conns[i];
      fds[i] = pollfd{-1, 0, 0};
      if (!c.open)
        continue;
      short events = 0;
      if (c.received < bytes) {
        auto before = c.received;
        auto r = try_read(c.fd, reinterpret_cast<char*>(c.grad.data()), bytes, c.received);
        if (r == io::failed) {
          if (before != 0) // a worker leaves between steps, never within one
            return std::fprintf(stderr, "raw ps: worker %zu broke off a step\n", i), 1;
          c.open = false;
          close(c.fd);
          continue;
        }
        moved |= r == io::moved;
        events |= c.received < bytes ? POLLIN : 0;
      }
      size_t limit = sync ? (c.step == sync_step ? sync_applied : 0) : c.applied;
      if (c.sent < limit) {
        auto r = try_write(c.fd, wbytes, limit, c.sent);
        if (r == io::failed)
          return std::fprintf(stderr, "raw ps: cannot answer worker %zu\n", i), 1;
        moved |= r == io::moved;
        if (c.sent < limit)
          events |= POLLOUT;
      }
      if (c.sent == bytes) { // the step is over for this worker
        ++c.step;
        async_steps += sync ? 0 : 1;
        c.received = c.applied = c.sent = 0;
        moved = true;
        if (window.ending) { // the run is over: the worker reads the end of the stream
          c.open = false;
          close(c.fd);
          continue;
        }
      }
      fds[i] = pollfd{c.fd, events, 0};
    }
    // Nothing moved: wait for a socket, unless only an update is pending
    // (it needs no socket and runs at the top of the loop).
    if (!moved) {
      bool waits_on_socket = std::any_of(fds.begin(), fds.end(),
                                         [](const pollfd& p) { return p.fd >= 0 && p.events; });
      if (waits_on_socket) {
        int r = poll(fds.data(), fds.size(), window.poll_ms());
        if (r == 0 && window.poll_ms() == stall_ms)
          return std::fprintf(stderr, "raw ps: no worker moved a byte for %d ms\n", stall_ms), 1;
        if (r < 0 && errno != EINTR)
          return 1;
      }
    }
  }
  if (!window.ending)
    return std::fprintf(stderr, "raw ps: the workers left before the timed window ended\n"), 1;
  std::printf("window_steps %lu\nwindow_seconds %.6f\n",
              static_cast<unsigned long>(window.steps1 - window.steps0),
              std::chrono::duration<double>(window.t1 - window.t0).count());
  return 0;
}

/// A raw-TCP worker of the 1 M workload (docs/training.md): its example is
/// train::per_worker_linear's (the same x as actorflow-train's, y = 1 +
/// rank); per step, the loss (x.w + b - y)^2 and its gradient 2 err [x, 1]
/// are computed from the parameters [w, b] it read last, the gradient pushed
/// whole and the parameters read whole. It runs until the ps ends the
/// stream between steps, then prints its steps and its last loss.
int raw_worker_main(const helper_args& a) {
  const auto rank = static_cast<uint32_t>(a.num("rank"));
  const size_t floats = a.num("floats"), bytes = floats * sizeof(float);
  const size_t features = floats - 1; // and the bias
  auto data = train::per_worker_linear(rank + 1, features, a.num("seed"));
  const float* x = data.x.data() + size_t{rank} * features;
  const float y = data.targets[rank];
  std::vector<float> w(floats, 0.0f), grad(floats, 0.0f);
  signal(SIGPIPE, SIG_IGN); // the ps may close first: a write then fails, it does not kill
  int fd = dial_loopback(static_cast<uint16_t>(a.num("port")));
  if (fd < 0 || !sock::send_all(fd, &rank, sizeof(rank)))
    return std::fprintf(stderr, "raw worker %u: cannot reach the ps\n", rank), 1;
  tune_socket(fd);
  uint64_t steps = 0;
  double loss = 0;
  for (;; ++steps) {
    float err = cblas_sdot(static_cast<int>(features), x, 1, w.data(), 1) + w[features] - y;
    loss = static_cast<double>(err) * err;
    const float scale = 2 * err;
    float* g = grad.data();
    for (size_t k = 0; k < features; ++k)
      g[k] = scale * x[k];
    g[features] = scale;
    size_t got = 0;
    if (!exchange(fd, fd, grad.data(), bytes, w.data(), bytes,
                  [&got](size_t, size_t in) { got = in; })) {
      if (got == 0 && steps > 0) // the ps ended the run between steps
        break;
      return std::fprintf(stderr, "raw worker %u: the ps broke off step %lu\n", rank,
                          static_cast<unsigned long>(steps)), 1;
    }
  }
  close(fd);
  std::printf("steps %lu\nloss %.9g\n", static_cast<unsigned long>(steps), loss);
  return 0;
}

} // namespace

int run_helper(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], helper_flag) != 0)
    return -1;
  auto a = helper_args::parse(argc, argv, 3);
  std::string role = argv[2];
  if (a.kv.count("slice")) // 0: unlimited
    io_slice = a.num("slice") ? a.num("slice") : SIZE_MAX;
  if (role == "raw-ps")
    return raw_ps_main(a);
  if (role == "raw-worker")
    return raw_worker_main(a);
  if (role == "raw-shm-ps")
    return raw_shm_ps_main(a);
  if (role == "raw-shm-worker")
    return raw_shm_worker_main(a);
  std::fprintf(stderr, "actorflow-bench: unknown helper %s\n", role.c_str());
  return 2;
}

} // namespace af::bench
