// The training benchmarks of actorflow-bench (issue 8); see bench_train.hpp.
//
// The baselines are written to be as fast as plain sockets allow on one
// machine: persistent connections, TCP_NODELAY, nonblocking sockets driven by
// poll() so that a process sends and receives at once, every buffer allocated
// before the first step, and the parameter server updating and answering
// chunk by chunk as gradients stream in (it starts sending parameters before
// the whole gradient has arrived).
#include "bench/bench_train.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include <cblas.h>

#include "caf/all.hpp"
#include "caf/io/middleman.hpp"

#include "dist/allreduce.hpp"
#include "actors/kv_store.hpp"
#include "actors/system.hpp"
#include "config/loopback.hpp"
#include "train/config.hpp"
#include "train/local.hpp"

namespace af::bench {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr size_t model_floats = size_t{1} << 20; // the 1 M-float model; 4 MiB
constexpr size_t synthetic_examples = 16;        // per worker, ours and raw alike
constexpr double linear_lr = 1e-7;               // lr * |x|^2 < 1: no divergence
constexpr size_t chunk_bytes = 64 << 10;         // the raw ps's unit of update

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0 : xs[xs.size() / 2];
}

/// A double as TOML and strtod read it back (std::to_string prints 1e-7 as 0.000000).
std::string exact(double x, int digits = 9) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, x);
  return buf;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch())
    .count();
}

// -- sockets ---------------------------------------------------------------------

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Large enough for a whole 4 MiB message in flight; the kernel caps it at
  // net.core.[rw]mem_max and doubles it.
  int bytes = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int dial_loopback(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  for (int attempt = 0; attempt < 200; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      return fd;
    if (fd >= 0)
      close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

/// Blocking-style write of a small message on a socket (before it is tuned).
bool write_all(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    auto r = ::write(fd, p, n);
    if (r <= 0)
      return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool read_all(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    auto r = ::read(fd, p, n);
    if (r <= 0)
      return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

/// What one nonblocking read or write did: moved bytes, would block, or failed
/// (error or end of stream).
enum class io { moved, blocked, failed };

/// Bytes one read or write moves at most (a helper's slice=N; 0: no limit).
/// No limit was fastest on the development VM for the ps and the exchange
/// alike (fewer system calls); 256 KiB and 1 MiB slices were 5-20% slower.
size_t io_slice = SIZE_MAX;

io try_read(int fd, char* buf, size_t n, size_t& done) {
  auto r = ::read(fd, buf + done, std::min(n - done, io_slice));
  if (r > 0) {
    done += static_cast<size_t>(r);
    return io::moved;
  }
  if (r < 0 && (errno == EAGAIN || errno == EINTR))
    return io::blocked;
  return io::failed;
}

io try_write(int fd, const char* buf, size_t n, size_t& done) {
  auto r = ::write(fd, buf + done, std::min(n - done, io_slice));
  if (r > 0) {
    done += static_cast<size_t>(r);
    return io::moved;
  }
  if (r < 0 && (errno == EAGAIN || errno == EINTR))
    return io::blocked;
  return io::failed;
}

/// How long a baseline's socket may make no progress before the helper
/// gives up (a peer that died or hung): the bench then reports the failure
/// instead of waiting for its own timeout.
constexpr int stall_ms = 30000;

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

/// key=value arguments of a helper.
struct helper_args {
  std::map<std::string, std::string> kv;

  std::string str(const std::string& key) const {
    auto i = kv.find(key);
    if (i == kv.end()) {
      std::fprintf(stderr, "actorflow-bench helper: missing %s=\n", key.c_str());
      std::exit(2);
    }
    return i->second;
  }
  uint64_t num(const std::string& key) const { return std::stoull(str(key)); }
  double real(const std::string& key) const { return std::stod(str(key)); }
};

/// The raw-TCP parameter server: accepts `workers` connections on listen-fd,
/// each announcing its rank, then serves steps until every worker has closed.
/// sync: the mean of one gradient from each worker is applied, then every
/// worker gets the parameters. async: each gradient is applied as it arrives
/// and answered to its sender. Both update and answer chunk by chunk.
int raw_ps_main(const helper_args& a) {
  int lfd = static_cast<int>(a.num("listen-fd"));
  auto workers = static_cast<size_t>(a.num("workers"));
  const size_t floats = a.num("floats"), bytes = floats * sizeof(float);
  const bool sync = a.str("mode") == "sync";
  const auto lr = static_cast<float>(a.real("lr"));
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
    if (fd < 0 || !read_all(fd, &rank, sizeof(rank)) || rank >= workers || conns[rank].fd >= 0)
      return std::fprintf(stderr, "raw ps: bad worker connection\n"), 1;
    tune_socket(fd);
    conns[rank].fd = fd;
    conns[rank].grad.assign(floats, 0.0f);
  }
  close(lfd);
  std::vector<float> w(floats, 0.0f);
  auto* wbytes = reinterpret_cast<const char*>(w.data());
  uint64_t sync_step = 0;
  size_t sync_applied = 0;
  std::vector<pollfd> fds(workers);
  auto any_open = [&] {
    return std::any_of(conns.begin(), conns.end(), [](const conn& c) { return c.open; });
  };
  while (any_open()) {
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
        auto target = usable(common, bytes);
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
        auto target = usable(c.received, bytes);
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
        c.received = c.applied = c.sent = 0;
        moved = true;
      }
      fds[i] = pollfd{c.fd, events, 0};
    }
    // Nothing moved: wait for a socket, unless only an update is pending
    // (it needs no socket and runs at the top of the loop).
    if (!moved) {
      bool waits_on_socket = std::any_of(fds.begin(), fds.end(),
                                         [](const pollfd& p) { return p.fd >= 0 && p.events; });
      if (waits_on_socket) {
        int r = poll(fds.data(), fds.size(), stall_ms);
        if (r == 0)
          return std::fprintf(stderr, "raw ps: no worker moved a byte for %d ms\n", stall_ms), 1;
        if (r < 0 && errno != EINTR)
          return 1;
      }
    }
  }
  return 0;
}

/// Synthetic linear-regression data of one worker: `examples` rows of
/// `floats` features in [-1, 1] and their targets (a fixed teacher's).
struct linear_data {
  std::vector<float> x, y;
};

linear_data make_linear_data(size_t examples, size_t floats, uint64_t seed) {
  linear_data d;
  d.x.resize(examples * floats);
  d.y.resize(examples);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : d.x) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v = static_cast<float>(static_cast<int64_t>(s >> 11) - (int64_t{1} << 52)) / 4.5e15f;
  }
  for (size_t e = 0; e < examples; ++e)
    d.y[e] = d.x[e * floats] - 0.5f * d.x[e * floats + 1];
  return d;
}

/// A raw-TCP worker: per step, the gradient of the squared error of one
/// example, x^T (x w - y), pushed whole; the parameters pulled whole. Prints
/// when its measured steps began and ended (steady clock, ns) and how many.
int raw_worker_main(const helper_args& a) {
  const auto rank = static_cast<uint32_t>(a.num("rank"));
  const size_t floats = a.num("floats"), bytes = floats * sizeof(float);
  const uint64_t steps = a.num("steps"), warmup = a.num("warmup");
  auto data = make_linear_data(synthetic_examples, floats, rank + 1);
  std::vector<float> w(floats, 0.0f), grad(floats, 0.0f);
  int fd = dial_loopback(static_cast<uint16_t>(a.num("port")));
  if (fd < 0 || !write_all(fd, &rank, sizeof(rank)))
    return std::fprintf(stderr, "raw worker %u: cannot reach the ps\n", rank), 1;
  tune_socket(fd);
  int64_t t0 = now_ns();
  for (uint64_t s = 0; s < warmup + steps; ++s) {
    if (s == warmup)
      t0 = now_ns();
    size_t e = (2 * s + rank) % synthetic_examples;
    const float* x = data.x.data() + e * floats;
    float err = cblas_sdot(static_cast<int>(floats), x, 1, w.data(), 1) - data.y[e];
    const float scale = 2 * err;
    float* g = grad.data();
    for (size_t k = 0; k < floats; ++k)
      g[k] = scale * x[k];
    if (!exchange(fd, fd, grad.data(), bytes, w.data(), bytes, [](size_t, size_t) {}))
      return std::fprintf(stderr, "raw worker %u: the ps broke off step %lu\n", rank,
                          static_cast<unsigned long>(s)), 1;
  }
  int64_t t1 = now_ns();
  close(fd);
  // w0, w1 tend to the teacher's 1 and -0.5 when floats = 2 (a check of the ps)
  std::printf("t0_ns %lld\nt1_ns %lld\nsteps %lu\nw0 %g\nw1 %g\n", static_cast<long long>(t0),
              static_cast<long long>(t1), static_cast<unsigned long>(steps), w[0], w[1]);
  return 0;
}

/// The raw-TCP exchange a 2-rank all-reduce must do at least: both ranks send
/// their buffer to the other over one socket and receive the other's at once,
/// averaging each chunk into their own buffer once it is both sent and
/// received. Rank 0 prints the median seconds of one exchange.
int raw_allreduce_main(const helper_args& a) {
  const auto rank = a.num("rank");
  const size_t floats = a.num("floats"), bytes = floats * sizeof(float);
  const uint64_t rounds = a.num("rounds"), warmup = a.num("warmup");
  // sockets=2: one connection per direction, as a ring has
  const bool two = a.kv.count("sockets") && a.num("sockets") == 2;
  int out_fd = -1, in_fd = -1;
  if (rank == 0) {
    int lfd = static_cast<int>(a.num("listen-fd"));
    out_fd = accept(lfd, nullptr, nullptr);
    in_fd = two ? accept(lfd, nullptr, nullptr) : out_fd;
    close(lfd);
  } else {
    in_fd = dial_loopback(static_cast<uint16_t>(a.num("port")));
    out_fd = two ? dial_loopback(static_cast<uint16_t>(a.num("port"))) : in_fd;
  }
  if (out_fd < 0 || in_fd < 0)
    return std::fprintf(stderr, "raw allreduce %lu: no connection\n",
                        static_cast<unsigned long>(rank)), 1;
  tune_socket(out_fd);
  if (two)
    tune_socket(in_fd);
  std::vector<float> data(floats, static_cast<float>(rank + 1)), theirs(floats);
  std::vector<double> secs;
  // scheme=halves (the default): each rank owns half the buffer. It sends the
  // other half, averages the peer's copy of its own half into it as it
  // arrives, streams the averaged bytes back, and takes the peer's averaged
  // half straight into place. The same 4 MiB each way as a plain swap, but
  // half the additions, and no scratch for the second half.
  const bool halves = !a.kv.count("scheme") || a.str("scheme") == "halves";
  const size_t half = floats / 2 * sizeof(float);
  for (uint64_t r = 0; r < warmup + rounds; ++r) {
    auto t0 = clock_type::now();
    if (halves) {
      char* base = reinterpret_cast<char*>(data.data());
      char* mine = base + (rank == 0 ? 0 : half);          // averaged here
      char* other = base + (rank == 0 ? half : 0);         // averaged by the peer
      const size_t mine_n = rank == 0 ? half : bytes - half;
      const size_t other_n = bytes - mine_n;
      char* scratch = reinterpret_cast<char*>(theirs.data());
      size_t sent = 0, got = 0, averaged = 0; // over the streams [other|mine] and [peer's mine|other]
      while (sent < bytes || got < bytes) {
        bool moved = false;
        // send the other half, then as much of ours as is averaged
        size_t limit = other_n + averaged;
        if (sent < limit) {
          io r;
          if (sent < other_n) {
            r = try_write(out_fd, other, other_n, sent);
          } else {
            size_t off = sent - other_n;
            r = try_write(out_fd, mine, averaged, off);
            sent = other_n + off;
          }
          if (r == io::failed)
            return std::fprintf(stderr, "raw allreduce: the peer broke off\n"), 1;
          moved |= r == io::moved;
        }
        if (got < bytes) {
          io r;
          if (got < mine_n) {
            r = try_read(in_fd, scratch, mine_n, got);
            // average what arrived, while it is in cache
            auto* m = reinterpret_cast<float*>(mine);
            auto* t = reinterpret_cast<const float*>(scratch);
            size_t upto = got / sizeof(float);
            for (size_t k = averaged / sizeof(float); k < upto; ++k)
              m[k] = 0.5f * (m[k] + t[k]);
            averaged = upto * sizeof(float);
          } else {
            size_t off = got - mine_n;
            r = try_read(in_fd, other, other_n, off);
            got = mine_n + off;
          }
          if (r == io::failed)
            return std::fprintf(stderr, "raw allreduce: the peer broke off\n"), 1;
          moved |= r == io::moved;
        }
        if (moved)
          continue;
        if (!wait_sockets(out_fd, sent < limit, in_fd, got < bytes))
          return 1;
      }
    } else {
      size_t averaged = 0;
      auto average = [&](size_t sent, size_t got) {
        auto upto = std::min(usable(sent, bytes), usable(got, bytes)) / sizeof(float);
        float* d = data.data();
        const float* t = theirs.data();
        for (size_t k = averaged; k < upto; ++k)
          d[k] = 0.5f * (d[k] + t[k]);
        averaged = std::max(averaged, upto);
      };
      if (!exchange(out_fd, in_fd, data.data(), bytes, theirs.data(), bytes, average))
        return std::fprintf(stderr, "raw allreduce: the peer broke off\n"), 1;
      average(bytes, bytes);
    }
    if (r >= warmup)
      secs.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  close(out_fd);
  if (two)
    close(in_fd);
  // every element is the mean, 1.5, after the first exchange (a check of the scheme)
  auto [lo, hi] = std::minmax_element(data.begin(), data.end());
  if (*lo != 1.5f || *hi != 1.5f)
    return std::fprintf(stderr, "raw allreduce %lu: wrong mean (%g..%g)\n",
                        static_cast<unsigned long>(rank), *lo, *hi), 1;
  if (rank == 0)
    std::printf("op_seconds %.9f\n", median(secs));
  return 0;
}

/// One rank of our all-reduce: rank 0 hosts the rendezvous store (published
/// on `port`), both join one allreduce_group and time allreduce_mean of the
/// same buffer as the raw exchange. Rank 0 prints the median seconds.
int allreduce_main(const helper_args& a) {
  const auto rank = static_cast<uint32_t>(a.num("rank"));
  const size_t floats = a.num("floats");
  const uint64_t rounds = a.num("rounds"), warmup = a.num("warmup");
  const auto port = static_cast<uint16_t>(a.num("port"));
  af::system_config cfg;
  caf::actor_system sys{cfg};
  kv_store_actor store;
  if (rank == 0) {
    store = spawn_kv_store(sys);
    if (auto p = sys.middleman().publish(store, port, "127.0.0.1", true); !p)
      return std::fprintf(stderr, "rank 0: cannot publish the store on port %u: %s\n", port,
                          sys.render(p.error()).c_str()), 1;
  } else {
    for (int attempt = 0; attempt < 500 && !store; ++attempt) {
      if (auto s = sys.middleman().remote_actor<kv_store_actor>("127.0.0.1", port))
        store = *s;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!store)
      return std::fprintf(stderr, "rank 1: no store at 127.0.0.1:%u\n", port), 1;
  }
  int rc = 0;
  {
    kv_client client{sys, store};
    auto group = allreduce_group::create(rank, 2, "bench", client, std::chrono::seconds(30),
                                         "127.0.0.1");
    if (!group)
      return std::fprintf(stderr, "rank %u: %s\n", rank, sys.render(group.error()).c_str()), 1;
    std::vector<float> data(floats, static_cast<float>(rank + 1));
    std::vector<double> secs;
    for (uint64_t r = 0; r < warmup + rounds && rc == 0; ++r) {
      auto t0 = clock_type::now();
      if (auto err = (*group)->allreduce_mean(data.data(), floats)) {
        std::fprintf(stderr, "rank %u: %s\n", rank, sys.render(err).c_str());
        rc = 1;
      } else if (r >= warmup) {
        secs.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
      }
    }
    if (rc == 0 && rank == 0)
      std::printf("op_seconds %.9f\ncheck %g\n", median(secs), data[0]);
  }
  if (rank == 0)
    caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
  return rc;
}

// -- running processes -------------------------------------------------------------------

/// A child: `args` exec'd with stdout and stderr into `log`, every other
/// descriptor closed but `keep`, killed if the bench dies.
pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log, int keep = -1) {
  std::vector<char*> argv;
  for (auto& s : args)
    argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid != 0)
    return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out >= 0) {
    dup2(out, 1);
    dup2(out, 2);
  }
  int keep_at = keep >= 0 ? keep : 2;
  if (keep_at > 3)
    close_range(3, static_cast<unsigned>(keep_at - 1), 0);
  close_range(static_cast<unsigned>(keep_at + 1), ~0u, 0);
  execv(argv[0], argv.data());
  std::perror("exec");
  _exit(127);
}

/// Why a group of children failed: which one failed first, and how.
struct group_failure {
  size_t who = 0;
  std::string why;
};

/// Waits for every child until `deadline` (sooner once one has failed: its
/// peers would wait for it in vain) and kills those left.
std::optional<group_failure> wait_all(const std::vector<pid_t>& pids,
                                      const std::vector<std::string>& names,
                                      clock_type::time_point deadline) {
  std::vector<bool> done(pids.size(), false);
  std::optional<group_failure> failure;
  for (;;) {
    bool pending = false;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i])
        continue;
      int status = 0;
      auto r = waitpid(pids[i], &status, WNOHANG);
      if (r == 0) {
        pending = true;
        continue;
      }
      done[i] = true;
      bool ok = r == pids[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !failure) {
        failure = group_failure{i, names[i] + (WIFSIGNALED(status)
                                                 ? " died of signal " + std::to_string(WTERMSIG(status))
                                                 : " exited with " + std::to_string(WEXITSTATUS(status)))};
        deadline = std::min(deadline, clock_type::now() + std::chrono::seconds(5));
      }
    }
    if (!pending)
      return failure;
    if (clock_type::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          if (!failure)
            failure = group_failure{i, names[i] + " still running after the deadline (killed)"};
        }
      return failure;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in{p};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The last line of `text` that is not empty, for failure messages.
std::string last_line(const std::string& text) {
  auto end = text.find_last_not_of("\n\r ");
  if (end == std::string::npos)
    return "(no output)";
  auto nl = text.rfind('\n', end);
  auto begin = nl == std::string::npos ? 0 : nl + 1;
  return text.substr(begin, end + 1 - begin);
}

/// "key value" lines of a helper's output.
std::map<std::string, double> parse_values(const std::string& text) {
  std::map<std::string, double> kv;
  std::istringstream in{text};
  std::string key;
  double value;
  while (in >> key >> value)
    kv[key] = value;
  return kv;
}

/// A scratch folder for configs and logs, removed at the end.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    char name[] = "/tmp/actorflow-bench-train-XXXXXX";
    if (mkdtemp(name))
      path = name;
  }
  ~scratch_dir() {
    std::error_code ec;
    if (!path.empty())
      std::filesystem::remove_all(path, ec);
  }
};

std::string self_exe() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

// -- the baselines ------------------------------------------------------------------------

/// Global steps/s of the raw ps with 2 raw workers, or nothing (why on stderr).
std::optional<double> raw_training(const std::string& mode, const train_bench_options& o,
                                   const scratch_dir& dir) {
  uint16_t port = 0;
  int lfd = listen_on_loopback(port, 16);
  if (lfd < 0)
    return std::nullopt;
  auto self = self_exe();
  auto floats = std::to_string(model_floats);
  std::vector<pid_t> pids;
  std::vector<std::string> names{"raw ps", "raw worker 0", "raw worker 1"};
  pids.push_back(spawn({self, helper_flag, "raw-ps", "listen-fd=" + std::to_string(lfd),
                        "workers=2", "floats=" + floats, "mode=" + mode,
                        "lr=" + exact(linear_lr)},
                       dir.path / "raw-ps.log", lfd));
  close(lfd);
  for (int r = 0; r < 2; ++r)
    pids.push_back(spawn({self, helper_flag, "raw-worker", "rank=" + std::to_string(r),
                          "port=" + std::to_string(port), "floats=" + floats,
                          "steps=" + std::to_string(o.steps_1m),
                          "warmup=" + std::to_string(o.warmup_1m)},
                         dir.path / ("raw-worker" + std::to_string(r) + ".log")));
  if (auto failure = wait_all(pids, names, clock_type::now() + o.timeout)) {
    std::fprintf(stderr, "actorflow-bench: raw %s ps: %s\n", mode.c_str(), failure->why.c_str());
    return std::nullopt;
  }
  auto w0 = parse_values(slurp(dir.path / "raw-worker0.log"));
  auto w1 = parse_values(slurp(dir.path / "raw-worker1.log"));
  if (!w0.count("t1_ns") || !w1.count("t1_ns"))
    return std::nullopt;
  if (mode == "sync") // every worker takes every step
    return w0["steps"] / ((w0["t1_ns"] - w0["t0_ns"]) / 1e9);
  // async: every push is a global step, over the span both workers measured
  auto span = std::max(w0["t1_ns"], w1["t1_ns"]) - std::min(w0["t0_ns"], w1["t0_ns"]);
  return (w0["steps"] + w1["steps"]) / (span / 1e9);
}

/// MB/s (of the 4 MiB buffer per exchange) of the raw exchange, rank 0's median.
std::optional<double> raw_allreduce(const train_bench_options& o, const scratch_dir& dir) {
  uint16_t port = 0;
  int lfd = listen_on_loopback(port, 4);
  if (lfd < 0)
    return std::nullopt;
  auto self = self_exe();
  std::vector<std::string> common{"floats=" + std::to_string(model_floats),
                                  "rounds=" + std::to_string(o.allreduce_rounds), "warmup=5"};
  auto args = [&](int rank) {
    std::vector<std::string> v{self, helper_flag, "raw-allreduce", "rank=" + std::to_string(rank),
                               "port=" + std::to_string(port), "listen-fd=" + std::to_string(lfd)};
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };
  std::vector<pid_t> pids{spawn(args(0), dir.path / "raw-ar0.log", lfd)};
  close(lfd);
  pids.push_back(spawn(args(1), dir.path / "raw-ar1.log"));
  if (auto failure = wait_all(pids, {"raw rank 0", "raw rank 1"}, clock_type::now() + o.timeout)) {
    std::fprintf(stderr, "actorflow-bench: raw all-reduce: %s\n", failure->why.c_str());
    return std::nullopt;
  }
  auto r0 = parse_values(slurp(dir.path / "raw-ar0.log"));
  if (!r0.count("op_seconds") || r0["op_seconds"] <= 0)
    return std::nullopt;
  return model_floats * sizeof(float) / 1e6 / r0["op_seconds"];
}

// -- ours -----------------------------------------------------------------------------------

/// What a run of actorflow-train's cluster gave: the chief's `train done:`
/// fields, or why there are none.
struct cluster_run {
  std::map<std::string, double> done;
  std::string failure;
};

/// One training job of processes: `ps_tasks` ps and `workers` workers;
/// `worker_args[i]`: extra arguments of worker i (a straggler's delay).
cluster_run run_cluster(const std::vector<std::string>& train_keys, const train_bench_options& o,
                        const scratch_dir& dir, const std::string& tag, int ps_tasks = 1,
                        int workers = 2,
                        const std::map<int, std::vector<std::string>>& worker_args = {}) {
  cluster_run out;
  auto bin = o.bin_dir / "actorflow-train";
  if (!std::filesystem::exists(bin)) {
    out.failure = bin.string() + " not found (build the actorflow-train target)";
    return out;
  }
  std::vector<uint16_t> ports;
  for (int i = 0; i < ps_tasks + workers; ++i)
    ports.push_back(free_loopback_port());
  // The training keys go on the command line (--set), the file holds the
  // cluster only: the same keys whether or not the cluster loader accepts a
  // [train] table beside it.
  auto config = dir.path / (tag + ".toml");
  {
    std::ofstream out{config};
    out << "[cluster]\nps = [";
    for (int k = 0; k < ps_tasks; ++k)
      out << (k ? ", " : "") << "\"127.0.0.1:" << ports[k] << "\"";
    out << "]\nworker = [";
    for (int w = 0; w < workers; ++w)
      out << (w ? ", " : "") << "\"127.0.0.1:" << ports[ps_tasks + w] << "\"";
    out << "]\n";
  }
  struct task {
    std::string job;
    int index;
  };
  std::vector<task> tasks;
  for (int k = 0; k < ps_tasks; ++k)
    tasks.push_back({"ps", k});
  for (int w = 0; w < workers; ++w)
    tasks.push_back({"worker", w});
  std::vector<pid_t> pids;
  std::vector<std::string> names;
  std::vector<std::filesystem::path> logs;
  for (auto& t : tasks) {
    std::vector<std::string> args{bin.string(), "--config", config.string(), "--job", t.job,
                                  "--task", std::to_string(t.index)};
    for (auto& sets : {train_keys, o.extra_sets})
      for (auto& kv : sets) {
        args.push_back("--set");
        args.push_back(kv);
      }
    if (auto extra = worker_args.find(t.index); t.job == "worker" && extra != worker_args.end())
      args.insert(args.end(), extra->second.begin(), extra->second.end());
    names.push_back(t.job + " " + std::to_string(t.index));
    logs.push_back(dir.path / (tag + "-" + t.job + std::to_string(t.index) + ".log"));
    pids.push_back(spawn(args, logs.back()));
  }
  if (auto failure = wait_all(pids, names, clock_type::now() + o.timeout)) {
    out.failure = failure->why + ": " + last_line(slurp(logs[failure->who]));
    return out;
  }
  auto chief_log = slurp(logs[static_cast<size_t>(ps_tasks)]);
  auto at = chief_log.find("train done:");
  if (at == std::string::npos) {
    out.failure = "the chief printed no `train done:` line: " + last_line(chief_log);
    return out;
  }
  std::istringstream line{chief_log.substr(at + 11, chief_log.find('\n', at) - at - 11)};
  std::string field;
  while (line >> field) {
    auto eq = field.find('=');
    if (eq == std::string::npos)
      continue;
    try {
      out.done[field.substr(0, eq)] = std::stod(field.substr(eq + 1));
    } catch (const std::exception&) {
      // mode=sync and the like: not a figure
    }
  }
  return out;
}

void report(const std::string& name, const std::vector<double>& ours,
            const std::vector<double>& base, const char* unit, const std::string& failure) {
  // every repetition, in the order they ran: how noisy this machine is now
  std::string reps = "# " + name + " reps: ours";
  for (double x : ours)
    reps += " " + exact(x, 4);
  reps += "; baseline";
  for (double x : base)
    reps += " " + exact(x, 4);
  std::printf("%s\n", reps.c_str());
  if (base.empty()) {
    std::printf("metric %s skipped: the baseline failed (see stderr)\n", name.c_str());
  } else if (!failure.empty() || ours.empty()) {
    std::printf("metric %s skipped: %s\n# %s baseline=%.3f unit=%s\n", name.c_str(),
                failure.empty() ? "no figure" : failure.c_str(), name.c_str(), median(base), unit);
  } else {
    auto o = median(ours), b = median(base);
    std::printf("metric %s ours=%.3f baseline=%.3f unit=%s ratio=%.3f\n", name.c_str(), o, b, unit,
                o / b);
  }
  std::fflush(stdout);
}

/// The steps/s of the chief's `train done:` line, or nullopt with `why` set.
std::optional<double> steps_per_s(const cluster_run& run, std::string& why) {
  if (!run.failure.empty()) {
    why = run.failure;
    return std::nullopt;
  }
  auto it = run.done.find("steps_per_s");
  if (it == run.done.end()) {
    why = "no steps_per_s in the chief's `train done:` line";
    return std::nullopt;
  }
  return it->second;
}

/// `key=value` of the [train] table for the 1 M-float linear regression.
std::vector<std::string> linear_keys(const std::string& mode, uint64_t steps) {
  return {"mode=" + mode, "model=linear", "data=synthetic_linear",
          "synthetic_features=" + std::to_string(model_floats),
          "synthetic_examples=" + std::to_string(synthetic_examples), "batch_size=1",
          "steps=" + std::to_string(steps), "learning_rate=" + exact(linear_lr), "log_every=0",
          "eval_every=0"};
}

void bench_linear(const std::string& mode, const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_" + mode + "_1m_2w";
  // async counts every push as a global step: 2x the steps, the same work per worker
  auto keys = linear_keys(mode, mode == "sync" ? o.steps_1m : 2 * o.steps_1m);
  std::vector<double> ours, base;
  std::string failure;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (auto b = raw_training(mode, o, dir))
      base.push_back(*b);
    if (failure.empty())
      if (auto x = steps_per_s(run_cluster(keys, o, dir, name), failure))
        ours.push_back(*x);
  }
  report(name, ours, base, "steps/s", failure);
}

/// The same sync job (1 ps + 2 worker processes on this host) with the data
/// plane on shared memory (the default between processes of one host)
/// against the same job with ACTORFLOW_DATA_SHM=off in its processes' environment (TCP over
/// loopback): what shared memory gains a whole job, alternating repetitions.
void bench_linear_shm(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_sync_1m_2w_shm_vs_tcp";
  auto keys = linear_keys("sync", o.steps_1m);
  const char* old = std::getenv("ACTORFLOW_DATA_SHM");
  std::string saved = old ? old : "";
  auto restore = [&] {
    if (old)
      setenv("ACTORFLOW_DATA_SHM", saved.c_str(), 1);
    else
      unsetenv("ACTORFLOW_DATA_SHM");
  };
  std::vector<double> ours, base;
  std::string failure, base_failure;
  for (int rep = 0; rep < o.reps; ++rep) {
    setenv("ACTORFLOW_DATA_SHM", "off", 1); // the children inherit it
    if (base_failure.empty()) {
      if (auto x = steps_per_s(run_cluster(keys, o, dir, name + "-tcp"), base_failure))
        base.push_back(*x);
      else
        std::fprintf(stderr, "actorflow-bench: %s baseline (TCP): %s\n", name.c_str(),
                     base_failure.c_str());
    }
    unsetenv("ACTORFLOW_DATA_SHM");
    if (failure.empty())
      if (auto x = steps_per_s(run_cluster(keys, o, dir, name), failure))
        ours.push_back(*x);
  }
  restore();
  report(name, ours, base, "steps/s", failure);
}

/// Sync with a straggler: 3 worker processes, one sleeping 3 steps' time in
/// each of its steps (4x slower), replicas_to_aggregate = 2, against 2
/// workers and no straggler (every gradient). Backup workers should make the
/// straggler cost nothing: the steps go at the speed of the other two.
void bench_straggler(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_sync_1m_3w_1slow";
  auto keys = linear_keys("sync", o.steps_1m);
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
      auto run = run_cluster(with_backup, o, dir, name, 1, 3,
                             {{2, {"--step-delay-ms", std::to_string(std::max(1, step_ms))}}});
      if (auto x = steps_per_s(run, failure))
        ours.push_back(*x);
    }
  }
  report(name, ours, base, "steps/s", failure);
}

void bench_digits(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "train_digits_examples_per_s";
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
    std::printf("metric %s skipped: the digits: %s\n", name.c_str(),
                data.error().what.c_str());
    return;
  }
  std::vector<double> ours, base;
  std::string failure;
  for (int rep = 0; rep < o.reps; ++rep) {
    // the same examples in one process: one batch of 64 per global step
    if (auto local = train::train_local(c, *data, o.digits_steps, 64))
      base.push_back(local->examples_per_s);
    else
      std::fprintf(stderr, "actorflow-bench: local digits training: %s\n",
                   local.error().what.c_str());
    if (failure.empty()) {
      auto run = run_cluster(keys, o, dir, "digits");
      if (!run.failure.empty())
        failure = run.failure;
      else if (run.done.count("examples_per_s"))
        ours.push_back(run.done["examples_per_s"]);
      else
        failure = "no examples_per_s in the chief's `train done:` line";
    }
  }
  report(name, ours, base, "examples/s", failure);
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

/// MB/s of our 2-rank allreduce_mean of the 4 MiB buffer, rank 0's median.
std::optional<double> ours_allreduce(const train_bench_options& o, const scratch_dir& dir,
                                     std::string& failure) {
  auto self = self_exe();
  auto port = free_loopback_port();
  std::vector<pid_t> pids;
  std::vector<std::filesystem::path> logs;
  for (int rank = 0; rank < 2; ++rank) {
    logs.push_back(dir.path / ("ar" + std::to_string(rank) + ".log"));
    pids.push_back(spawn({self, helper_flag, "allreduce", "rank=" + std::to_string(rank),
                          "port=" + std::to_string(port), "floats=" + std::to_string(model_floats),
                          "rounds=" + std::to_string(o.allreduce_rounds), "warmup=5"},
                         logs.back()));
  }
  if (auto f = wait_all(pids, {"rank 0", "rank 1"}, clock_type::now() + o.timeout)) {
    failure = f->why + ": " + last_line(slurp(logs[f->who]));
    return std::nullopt;
  }
  auto r0 = parse_values(slurp(logs[0]));
  if (!r0.count("op_seconds") || r0["op_seconds"] <= 0) {
    failure = "rank 0 printed no op_seconds";
    return std::nullopt;
  }
  return model_floats * sizeof(float) / 1e6 / r0["op_seconds"];
}

void bench_allreduce(const train_bench_options& o, const scratch_dir& dir) {
  const std::string name = "allreduce_4mib_2w";
  std::vector<double> ours, base;
  std::string failure;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (auto b = raw_allreduce(o, dir))
      base.push_back(*b);
    if (failure.empty()) {
      if (auto r = ours_allreduce(o, dir, failure))
        ours.push_back(*r);
    }
  }
  report(name, ours, base, "MB/s", failure);
}

} // namespace

const std::vector<std::string>& train_metrics() {
  static const std::vector<std::string> names{"train_sync_1m_2w", "train_async_1m_2w",
                                              "allreduce_4mib_2w", "train_digits_examples_per_s",
                                              "train_sync_partitioned_3ps",
                                              "train_sync_1m_3w_1slow",
                                              "train_sync_1m_2w_shm_vs_tcp"};
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
              "with the baseline; 1m: %lu sync steps, digits: %lu steps\n",
              opts.reps, static_cast<unsigned long>(opts.steps_1m),
              static_cast<unsigned long>(opts.digits_steps));
  std::fflush(stdout);
  if (want("train_sync_1m_2w"))
    bench_linear("sync", opts, dir);
  if (want("train_async_1m_2w"))
    bench_linear("async", opts, dir);
  if (want("allreduce_4mib_2w"))
    bench_allreduce(opts, dir);
  if (want("train_digits_examples_per_s"))
    bench_digits(opts, dir);
  if (want("train_sync_partitioned_3ps"))
    bench_partitioned(opts, dir);
  if (want("train_sync_1m_3w_1slow"))
    bench_straggler(opts, dir);
  if (want("train_sync_1m_2w_shm_vs_tcp"))
    bench_linear_shm(opts, dir);
}

namespace {

// -- the soak (issue 11 §3) --------------------------------------------------------------

/// One task of the soak's job: an actorflow-train process whose output goes
/// to a file (one per incarnation), so nothing has to drain a pipe.
struct soak_task {
  std::string job;
  int index = 0;
  pid_t pid = -1;
  std::string log;          ///< this incarnation's output
  int incarnation = 0;
  double rss_start_mb = -1; ///< this incarnation's, once it trained a while
  std::chrono::steady_clock::time_point started{};
};

double rss_mb(pid_t pid) {
  std::ifstream f{"/proc/" + std::to_string(pid) + "/status"};
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stod(line.substr(6)) / 1024.0; // kB
  return -1;
}

std::string read_text(const std::string& path) {
  std::ifstream f{path};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

/// Starts (again) `t`: actorflow-train --config CONFIG --job J --task I [--join].
void soak_launch(soak_task& t, const std::string& bin, const std::string& config,
                 const std::string& dir, bool join) {
  t.incarnation += 1;
  t.log = dir + "/" + t.job + std::to_string(t.index) + "-" + std::to_string(t.incarnation)
          + ".log";
  std::vector<std::string> args{bin, "--config", config, "--job", t.job, "--task",
                                std::to_string(t.index)};
  if (join)
    args.push_back("--join");
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(t.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  t.pid = pid;
  t.rss_start_mb = -1;
  t.started = std::chrono::steady_clock::now();
}

bool soak_running(soak_task& t) {
  if (t.pid <= 0)
    return false;
  int status = 0;
  if (waitpid(t.pid, &status, WNOHANG) == t.pid) {
    t.pid = -1;
    return false;
  }
  return true;
}

void soak_kill(soak_task& t) {
  if (t.pid > 0) {
    ::kill(t.pid, SIGKILL);
    int status = 0;
    waitpid(t.pid, &status, 0);
    t.pid = -1;
  }
}

/// Waits up to `timeout` for `cond`, polling every 50 ms.
template <class Cond>
bool soak_wait(Cond cond, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

/// `actorflow-bench --soak SECONDS [--soak-interval S] [--soak-checkpoint K]`:
/// a sync job of 2 ps and 2 workers (the digits MLP) on loopback, checkpoint
/// every K steps; every S seconds one of worker 1, ps 0 and ps 1 (at random,
/// seeded) is killed with SIGKILL and restarted (a worker with --join, once
/// the chief has seen it leave; a ps at once: the chief restores it). The
/// chief is not killed: the job stops without it by design. Prints each
/// fault and, at the end, the steps done, the faults, the updates lost
/// (per ps recovery: the steps between the checkpoint it was restored from
/// and the step it was restored at, as the chief reports them; a killed
/// worker loses only its gradient in flight, which a sync step closes
/// without) and the chief's and every current process's RSS at its start
/// (after 5 s of training) and at the end. Exit 0 if the job kept going and
/// no recovery lost more than one checkpoint interval.
int run_soak(int argc, char** argv) {
  double seconds = std::stod(argv[2]);
  double interval = 15;
  uint64_t K = 50;
  unsigned seed = 1;
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--soak-interval")
      interval = std::stod(argv[i + 1]);
    else if (k == "--soak-checkpoint")
      K = std::stoull(argv[i + 1]);
    else if (k == "--soak-seed")
      seed = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else
      return std::fprintf(stderr, "actorflow-bench --soak: unknown option %s\n", k.c_str()), 2;
  }
  auto bin = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "actorflow-train")
               .string();
  char tmpl[] = "/tmp/actorflow-soak-XXXXXX";
  if (!mkdtemp(tmpl))
    return std::fprintf(stderr, "actorflow-bench --soak: mkdtemp: %s\n", std::strerror(errno)), 1;
  std::string dir = tmpl;
  auto port = [] { return "\"127.0.0.1:" + std::to_string(free_loopback_port()) + "\""; };
  auto config = dir + "/soak.toml";
  {
    std::ofstream f{config};
    f << "[cluster]\nps = [" << port() << ", " << port() << "]\nworker = [" << port() << ", "
      << port() << "]\n\n[train]\nmode = \"sync\"\nsteps = 1000000000\ncheckpoint_dir = \""
      << dir << "/ckpt\"\ncheckpoint_steps = " << K
      << "\nlog_every = 100\neval_every = 0\nps_recovery_timeout_ms = 60000\n"
         "step_timeout_ms = 60000\n";
  }
  std::printf("soak: %.0f s of sync training, 2 ps + 2 workers, a checkpoint every %llu steps, "
              "a kill -9 every %.0f s (seed %u); logs in %s\n",
              seconds, static_cast<unsigned long long>(K), interval, seed, dir.c_str());
  std::fflush(stdout);
  auto task = [](const char* job, int index) {
    soak_task t;
    t.job = job;
    t.index = index;
    return t;
  };
  std::vector<soak_task> tasks{task("ps", 0), task("ps", 1), task("worker", 1), task("worker", 0)};
  for (auto& t : tasks)
    soak_launch(t, bin, config, dir, false);
  auto& chief = tasks[3];
  auto chief_out = [&] { return read_text(chief.log); };
  auto last_step = [&]() -> uint64_t {
    auto out = chief_out();
    auto at = out.rfind("\nstep ");
    if (at == std::string::npos)
      return 0;
    return std::stoull(out.substr(at + 6));
  };
  auto fail = [&](const std::string& why) {
    std::printf("soak FAILED: %s (logs in %s)\n", why.c_str(), dir.c_str());
    std::fflush(stdout);
    // Where each live process waits, beside its log, when gdb is there: a
    // hang seen once in 10 minutes is not seen again on demand.
    // (mkdtemp's directory has no quote; each gdb is bounded to 30 s.)
    if (::access("/usr/bin/gdb", X_OK) == 0)
      for (auto& t : tasks)
        if (soak_running(t)) {
          auto out = dir + "/" + t.job + std::to_string(t.index) + "-"
                     + std::to_string(t.incarnation) + ".stacks";
          auto cmd = "timeout 30 /usr/bin/gdb -batch -p " + std::to_string(t.pid)
                     + " -ex 'thread apply all bt' > '" + out + "' 2>&1";
          int rc = std::system(cmd.c_str());
          std::printf("soak: stacks of /job:%s/task:%d %s %s\n", t.job.c_str(), t.index,
                      rc == 0 ? "in" : "not taken (gdb failed: ptrace not allowed?), see",
                      out.c_str());
        }
    for (auto& t : tasks)
      soak_kill(t);
    return 1;
  };
  if (!soak_wait([&] { return last_step() > 0; }, std::chrono::seconds(60)))
    return fail("the chief printed no progress line within 60 s");
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto sample_rss = [&] {
    for (auto& t : tasks)
      if (t.rss_start_mb < 0 && t.pid > 0
          && std::chrono::steady_clock::now() - t.started > std::chrono::seconds(5))
        t.rss_start_mb = rss_mb(t.pid);
  };
  std::mt19937 rng{seed};
  int faults = 0, ps_faults = 0, worker_faults = 0;
  uint64_t step_start = last_step();
  double next_fault = interval;
  while (elapsed() < seconds) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    sample_rss();
    if (!soak_running(chief))
      return fail("the chief exited");
    if (elapsed() < next_fault)
      continue;
    next_fault = elapsed() + interval;
    auto& victim = tasks[std::uniform_int_distribution<size_t>{0, 2}(rng)];
    auto before = chief_out();
    auto step = last_step();
    auto t_kill = std::chrono::steady_clock::now();
    soak_kill(victim);
    faults += 1;
    std::string what;
    if (victim.job == "ps") {
      ps_faults += 1;
      soak_launch(victim, bin, config, dir, false);
      auto n = occurrences(before, "ps recovered: ");
      if (!soak_wait([&] { return occurrences(chief_out(), "ps recovered: ") > n; },
                     std::chrono::seconds(90)))
        return fail("the chief did not restore /job:ps/task:" + std::to_string(victim.index)
                    + " within 90 s");
      auto out = chief_out();
      auto at = out.rfind("ps recovered: ");
      what = out.substr(at, out.find('\n', at) - at);
    } else {
      worker_faults += 1;
      auto n = occurrences(before, "(/job:worker/task:1 at ");
      (void)n;
      auto left = occurrences(before, ") left at global step");
      if (!soak_wait([&] { return occurrences(chief_out(), ") left at global step") > left; },
                     std::chrono::seconds(60)))
        return fail("the chief did not see worker 1 leave within 60 s");
      auto joined = occurrences(before, ") joined at global step");
      soak_launch(victim, bin, config, dir, true);
      if (!soak_wait([&] { return occurrences(chief_out(), ") joined at global step") > joined; },
                     std::chrono::seconds(60)))
        return fail("worker 1 did not rejoin within 60 s");
      what = "worker 1 rejoined";
    }
    std::printf("soak: fault %d at %.1f s (step %llu): kill -9 /job:%s/task:%d; back in %.1f s: "
                "%s\n",
                faults, elapsed(), static_cast<unsigned long long>(step), victim.job.c_str(),
                victim.index,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count(),
                what.c_str());
    std::fflush(stdout);
  }
  // The figures, then every process is stopped.
  auto out = chief_out();
  uint64_t lost = 0, beyond = 0, recoveries = 0;
  {
    std::regex re{R"(ps recovered: \S+ from .+ checkpoint_step=\d+ at global_step=\d+ lost=(\d+))"};
    for (std::sregex_iterator it{out.begin(), out.end(), re}, end; it != end; ++it) {
      auto l = std::stoull((*it)[1].str());
      recoveries += 1;
      lost += l;
      if (l > K)
        beyond += l - K;
    }
  }
  auto steps_done = last_step() - step_start;
  std::printf("soak: %.0f s, %llu steps (%.1f steps/s), %d faults (%d ps, %d worker), %llu ps "
              "recoveries, %llu updates lost in all, %llu beyond one checkpoint interval (%llu)\n",
              elapsed(), static_cast<unsigned long long>(steps_done),
              static_cast<double>(steps_done) / elapsed(), faults, ps_faults, worker_faults,
              static_cast<unsigned long long>(recoveries), static_cast<unsigned long long>(lost),
              static_cast<unsigned long long>(beyond), static_cast<unsigned long long>(K));
  bool flat = true;
  for (auto& t : tasks) {
    double end = t.pid > 0 ? rss_mb(t.pid) : -1;
    double ratio = t.rss_start_mb > 0 && end > 0 ? end / t.rss_start_mb : 0;
    std::printf("soak: /job:%s/task:%d incarnation %d: RSS %.1f MB at its start, %.1f MB at the "
                "end (ratio %.3f)\n",
                t.job.c_str(), t.index, t.incarnation, t.rss_start_mb, end, ratio);
    if (&t == &chief && (ratio > 1.10 || ratio < 0.90))
      flat = false;
  }
  std::printf("metric soak steps=%llu faults=%d updates_lost=%llu lost_beyond_interval=%llu "
              "chief_rss_ratio=%.3f\n",
              static_cast<unsigned long long>(steps_done), faults,
              static_cast<unsigned long long>(lost), static_cast<unsigned long long>(beyond),
              chief.rss_start_mb > 0 ? rss_mb(chief.pid) / chief.rss_start_mb : 0.0);
  std::fflush(stdout);
  for (auto& t : tasks)
    soak_kill(t);
  if (beyond > 0)
    return std::printf("soak FAILED: a recovery lost more than one checkpoint interval\n"), 1;
  if (!flat)
    std::printf("soak: the chief's RSS moved more than 10 %%\n");
  return flat ? 0 : 1;
}

} // namespace

int run_helper(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--soak") == 0)
    return run_soak(argc, argv);
  if (argc < 3 || std::strcmp(argv[1], helper_flag) != 0)
    return -1;
  helper_args a;
  for (int i = 3; i < argc; ++i) {
    std::string s = argv[i];
    auto eq = s.find('=');
    if (eq != std::string::npos)
      a.kv[s.substr(0, eq)] = s.substr(eq + 1);
  }
  std::string role = argv[2];
  if (a.kv.count("slice")) // 0: unlimited
    io_slice = a.num("slice") ? a.num("slice") : SIZE_MAX;
  if (role == "raw-ps")
    return raw_ps_main(a);
  if (role == "raw-worker")
    return raw_worker_main(a);
  if (role == "raw-allreduce")
    return raw_allreduce_main(a);
  if (role == "allreduce")
    return allreduce_main(a);
  std::fprintf(stderr, "actorflow-bench: unknown helper %s\n", role.c_str());
  return 2;
}

} // namespace af::bench
