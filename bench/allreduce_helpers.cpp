// The rank processes of the all-reduce metrics (allreduce_bench.hpp): each
// runs our ring (dist/allreduce.hpp) and a hand-written exchange of the same
// bytes, alternately, round by round, so that both sample the same moments
// of a noisy machine. `transport=tcp`: our ring with ACTORFLOW_DATA_SHM=off
// against the raw-TCP exchange; `transport=shm`: our ring on shared memory
// against a raw shared-memory exchange.
//
// The raw exchanges are the 2-rank all-reduce written by hand, as fast as
// plain sockets or a plain pair of rings allow: each rank owns half the
// buffer, sends the other half, averages the peer's copy of its own half into
// place as it arrives, streams the averaged bytes back, and takes the peer's
// averaged half into place: 4 MiB each way, half the additions of a swap.
#include "bench/allreduce_bench.hpp"
#include "bench/raw_helpers.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/middleman.hpp"

#include "actors/kv_store.hpp"
#include "actors/system.hpp"
#include "bench/train_common.hpp"
#include "config/loopback.hpp"
#include "dist/allreduce.hpp"
#include "net/socket.hpp"

namespace af::bench {

namespace {

// -- sockets (tune_socket, dial_loopback, try_read, try_write: raw_helpers.hpp) --

/// Waits until `fd` can take bytes (if `want_out`) or has some (if
/// `want_in`). False on an error or after stall_ms without either.
bool wait_socket(int fd, bool want_out, bool want_in) {
  pollfd p{fd, static_cast<short>((want_out ? POLLOUT : 0) | (want_in ? POLLIN : 0)), 0};
  int r = poll(&p, 1, stall_ms);
  if (r == 0)
    std::fprintf(stderr, "bench helper: no progress on its socket for %d ms\n", stall_ms);
  return r > 0 || (r < 0 && errno == EINTR);
}

/// The halves of rank `rank`'s buffer: the one it averages (mine) and the
/// one its peer averages (other), as byte spans.
struct halves {
  char* mine;
  char* other;
  size_t mine_n;
  size_t other_n;
  halves(float* data, size_t floats, uint64_t rank) {
    auto* base = reinterpret_cast<char*>(data);
    const size_t half = floats / 2 * sizeof(float), bytes = floats * sizeof(float);
    mine = base + (rank == 0 ? 0 : half);
    other = base + (rank == 0 ? half : 0);
    mine_n = rank == 0 ? half : bytes - half;
    other_n = bytes - mine_n;
  }
};

/// The raw exchange's system calls, as our ring's last_call() counts its
/// own: reads and writes on TCP (those that moved nothing too), and sleeps
/// (polls). The barrier's are not counted.
struct raw_counts {
  uint64_t io = 0;
  uint64_t sleeps = 0;
};
raw_counts raw_calls;

// -- the raw-TCP exchange ------------------------------------------------------------

/// One all-reduce (mean) of `data` with the peer over one socket: the other
/// half out, then as much of ours as is averaged; in, the peer's copy of our
/// half (averaged as it arrives, while in cache), then its averaged half.
bool raw_tcp_round(int fd, uint64_t rank, float* data, size_t floats, float* scratch_floats) {
  halves h{data, floats, rank};
  const size_t bytes = h.mine_n + h.other_n;
  char* scratch = reinterpret_cast<char*>(scratch_floats);
  size_t sent = 0, got = 0, averaged = 0; // over the streams [other|mine] and [peer's mine|other]
  while (sent < bytes || got < bytes) {
    bool moved = false;
    size_t limit = h.other_n + averaged;
    if (sent < limit) {
      io r;
      ++raw_calls.io;
      if (sent < h.other_n) {
        r = try_write(fd, h.other, h.other_n, sent);
      } else {
        size_t off = sent - h.other_n;
        r = try_write(fd, h.mine, averaged, off);
        sent = h.other_n + off;
      }
      if (r == io::failed)
        return false;
      moved |= r == io::moved;
    }
    if (got < bytes) {
      io r;
      ++raw_calls.io;
      if (got < h.mine_n) {
        r = try_read(fd, scratch, h.mine_n, got);
        auto* m = reinterpret_cast<float*>(h.mine);
        auto* t = reinterpret_cast<const float*>(scratch);
        size_t upto = got / sizeof(float);
        for (size_t k = averaged / sizeof(float); k < upto; ++k)
          m[k] = 0.5f * (m[k] + t[k]);
        averaged = upto * sizeof(float);
      } else {
        size_t off = got - h.mine_n;
        r = try_read(fd, h.other, h.other_n, off);
        got = h.mine_n + off;
      }
      if (r == io::failed)
        return false;
      moved |= r == io::moved;
    }
    if (!moved && (++raw_calls.sleeps, !wait_socket(fd, sent < limit, got < bytes)))
      return false;
  }
  return true;
}

// -- the raw shared-memory exchange ---------------------------------------------------

/// One direction's counters, as one would write them by hand: the writer
/// moves head, the reader tail; a side about to sleep raises its flag, and
/// the other rings its bell (a byte on a socket) when it sees it.
struct raw_ring_control {
  alignas(64) std::atomic<uint64_t> head;
  std::atomic<uint32_t> reader_waiting;
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> writer_waiting;
};

/// The same sizes and wake-up rule as our link (dist/allreduce_shm.cpp,
/// dist/allreduce.cpp), so that the two differ only in their code.
constexpr uint64_t raw_ring_bytes = uint64_t{4} << 20;
constexpr size_t raw_slice = 256 * 1024;
constexpr uint64_t raw_bell_bytes = uint64_t{256} << 10;
constexpr size_t raw_header = 4096;

/// Both rings of the pair, mapped; `fd`: the doorbell socket.
struct raw_shm {
  raw_ring_control* out = nullptr;
  raw_ring_control* in = nullptr;
  char* out_data = nullptr;
  char* in_data = nullptr;
  int fd = -1;
  uint64_t head = 0, tail = 0;              // ours: out's head, in's tail
  uint64_t out_belled = 0, in_belled = 0;   // head and tail when last rung
};

/// Rings the peer if it sleeps and `force` or enough moved since its bell.
void raw_bell(std::atomic<uint32_t>& flag, uint64_t pos, uint64_t& belled, int fd, bool force) {
  if (pos == belled || (!force && pos - belled < raw_bell_bytes))
    return;
  if (flag.load() != 0 && flag.exchange(0) != 0) {
    char b = 1;
    [[maybe_unused]] auto r = ::send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    belled = pos;
  }
}

/// Maps the pair's segment: rank 0 creates it and names it on `fd` (still
/// blocking), rank 1 opens it; rank 0 removes the name on the answer.
bool raw_shm_map(raw_shm& s, int fd, uint64_t rank) {
  const size_t bytes = raw_header + 2 * raw_ring_bytes;
  std::string name = "/actorflow-bench-raw-" + std::to_string(::getpid());
  int mfd = -1;
  if (rank == 0) {
    mfd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (mfd < 0 || ::ftruncate(mfd, static_cast<off_t>(bytes)) != 0)
      return false;
    uint32_t n = static_cast<uint32_t>(name.size());
    if (!sock::send_all(fd, &n, sizeof(n)) || !sock::send_all(fd, name.data(), n))
      return false;
  } else {
    uint32_t n = 0;
    if (!sock::recv_all(fd, &n, sizeof(n)) || n > 255)
      return false;
    name.resize(n);
    if (!sock::recv_all(fd, name.data(), n))
      return false;
    mfd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (mfd < 0)
      return false;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd, 0);
  ::close(mfd);
  char ok = 1;
  if (p == MAP_FAILED || (rank == 1 && !sock::send_all(fd, &ok, 1))
      || (rank == 0 && !sock::recv_all(fd, &ok, 1)))
    return false;
  if (rank == 0)
    ::shm_unlink(name.c_str());
  auto* base = static_cast<char*>(p);
  auto* c0 = reinterpret_cast<raw_ring_control*>(base);
  auto* c1 = reinterpret_cast<raw_ring_control*>(base + 256);
  s.out = rank == 0 ? c0 : c1;
  s.in = rank == 0 ? c1 : c0;
  s.out_data = base + raw_header + (rank == 0 ? 0 : raw_ring_bytes);
  s.in_data = base + raw_header + (rank == 0 ? raw_ring_bytes : 0);
  s.fd = fd;
  return true;
}

/// Nothing moved: raise the flags, ring what the peer waits for, look once
/// more, and sleep on the doorbell (no spinning first, as ours).
bool raw_shm_wait(raw_shm& s, bool want_in, bool want_room) {
  auto ready = [&] {
    return (want_in && s.in->head.load() != s.tail)
           || (want_room && s.head - s.out->tail.load() < raw_ring_bytes);
  };
  if (want_in)
    s.in->reader_waiting.store(1);
  if (want_room)
    s.out->writer_waiting.store(1);
  raw_bell(s.out->reader_waiting, s.head, s.out_belled, s.fd, true);
  raw_bell(s.in->writer_waiting, s.tail, s.in_belled, s.fd, true);
  bool ok = true;
  if (!ready()) {
    ++raw_calls.sleeps;
    pollfd p{s.fd, POLLIN, 0};
    ok = ::poll(&p, 1, stall_ms) > 0;
    char bells[64];
    while (ok && ::recv(s.fd, bells, sizeof(bells), MSG_DONTWAIT) > 0) {
    }
  }
  s.in->reader_waiting.store(0);
  s.out->writer_waiting.store(0);
  return ok;
}

/// The raw-TCP round's scheme over the pair of rings; the peer's copy of our
/// half is averaged straight from its ring.
bool raw_shm_round(raw_shm& s, uint64_t rank, float* data, size_t floats) {
  halves h{data, floats, rank};
  const size_t bytes = h.mine_n + h.other_n;
  size_t sent = 0, got = 0, averaged = 0;
  while (sent < bytes || got < bytes) {
    bool moved = false;
    size_t limit = h.other_n + averaged;
    if (sent < limit) {
      uint64_t off = s.head & (raw_ring_bytes - 1);
      uint64_t room = raw_ring_bytes - (s.head - s.out->tail.load());
      size_t end = sent < h.other_n ? h.other_n : limit;
      size_t k = std::min<uint64_t>({room, raw_ring_bytes - off, end - sent, raw_slice});
      if (k > 0) {
        const char* src = sent < h.other_n ? h.other + sent : h.mine + (sent - h.other_n);
        std::memcpy(s.out_data + off, src, k);
        s.head += k;
        s.out->head.store(s.head);
        sent += k;
        raw_bell(s.out->reader_waiting, s.head, s.out_belled, s.fd, sent == end);
        moved = true;
      }
    }
    if (got < bytes) {
      uint64_t off = s.tail & (raw_ring_bytes - 1);
      uint64_t avail = s.in->head.load() - s.tail;
      size_t end = got < h.mine_n ? h.mine_n : bytes;
      size_t k = std::min<uint64_t>({avail, raw_ring_bytes - off, end - got, raw_slice});
      if (k > 0) {
        const char* src = s.in_data + off;
        if (got < h.mine_n) {
          auto* m = reinterpret_cast<float*>(h.mine + got);
          auto* t = reinterpret_cast<const float*>(src);
          for (size_t i = 0; i < k / sizeof(float); ++i)
            m[i] = 0.5f * (m[i] + t[i]);
          averaged = got + k;
        } else {
          std::memcpy(h.other + (got - h.mine_n), src, k);
        }
        got += k;
        s.tail += k;
        s.in->tail.store(s.tail);
        raw_bell(s.in->writer_waiting, s.tail, s.in_belled, s.fd, got == end);
        moved = true;
      }
    }
    if (!moved && !raw_shm_wait(s, got < bytes, sent < limit))
      return false;
  }
  return true;
}

// -- the pair -----------------------------------------------------------------------

/// This thread's CPU time (user and system, us) and context switches
/// (voluntary and not) so far: a call's own cost, steadier than its wall time
/// on a shared machine (the ring runs on the caller's thread, as the raw
/// exchange does).
struct thread_usage {
  double cpu_us = 0;
  double switches = 0;
  static thread_usage now() {
    rusage u{};
    ::getrusage(RUSAGE_THREAD, &u);
    auto us = [](const timeval& t) { return t.tv_sec * 1e6 + static_cast<double>(t.tv_usec); };
    return {us(u.ru_utime) + us(u.ru_stime), static_cast<double>(u.ru_nvcsw + u.ru_nivcsw)};
  }
};

/// Both ranks send a byte on `fd` and wait for the other's: the rounds start
/// together (not timed).
bool barrier(int fd) {
  char b = 1;
  size_t sent = 0, got = 0;
  while (sent < 1 || got < 1) {
    if (sent < 1 && try_write(fd, &b, 1, sent) == io::failed)
      return false;
    if (got < 1 && try_read(fd, &b, 1, got) == io::failed)
      return false;
    if ((sent < 1 || got < 1) && !wait_socket(fd, sent < 1, got < 1))
      return false;
  }
  return true;
}

/// The store of our ring's rendezvous: rank 0 hosts it on `port`, rank 1
/// finds it there.
kv_store_actor join_store(caf::actor_system& sys, uint32_t rank, uint16_t port) {
  if (rank == 0) {
    auto store = spawn_kv_store(sys);
    if (auto p = sys.middleman().publish(store, port, "127.0.0.1", true); !p) {
      std::fprintf(stderr, "rank 0: cannot publish the store on port %u: %s\n", port,
                   sys.render(p.error()).c_str());
      return {};
    }
    return store;
  }
  for (int attempt = 0; attempt < 500; ++attempt) {
    if (auto s = sys.middleman().remote_actor<kv_store_actor>("127.0.0.1", port))
      return *s;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "rank 1: no store at 127.0.0.1:%u\n", port);
  return {};
}

/// The raw exchange's connections: rank 0 accepts on listen-fd, rank 1 dials
/// `raw-port`. [0]: the barrier and the raw-TCP exchange; [1]: the raw
/// shared memory's doorbell.
bool raw_connect(const helper_args& a, uint64_t rank, int (&fds)[2]) {
  for (int& fd : fds) {
    if (rank == 0)
      fd = ::accept(static_cast<int>(a.num("listen-fd")), nullptr, nullptr);
    else
      fd = dial_loopback(static_cast<uint16_t>(a.num("raw-port")));
    if (fd < 0)
      return false;
  }
  if (rank == 0)
    ::close(static_cast<int>(a.num("listen-fd")));
  return true;
}

/// One rank: our ring and the raw exchange, alternately (which goes first
/// alternates too), each round after a barrier. Rank 0 prints the median
/// seconds of each.
int pair_main(const helper_args& a) {
  const auto rank = static_cast<uint32_t>(a.num("rank"));
  const size_t floats = a.num("floats");
  const uint64_t rounds = a.num("rounds"), warmup = a.num("warmup");
  const bool shm = a.str("transport") == "shm";
  if (!shm) // our ring on TCP, as between hosts
    ::setenv("ACTORFLOW_DATA_SHM", "off", 1);
  int fds[2] = {-1, -1};
  if (!raw_connect(a, rank, fds))
    return std::fprintf(stderr, "rank %u: no raw connection\n", rank), 1;
  raw_shm rs;
  if (shm && !raw_shm_map(rs, fds[1], rank))
    return std::fprintf(stderr, "rank %u: no raw shared memory: %s\n", rank, std::strerror(errno)), 1;
  tune_socket(fds[0]);
  tune_socket(fds[1]);
  af::system_config cfg;
  auto sys_owner = af::start_actor_system(cfg);
  caf::actor_system& sys = *sys_owner;
  auto store = join_store(sys, rank, static_cast<uint16_t>(a.num("port")));
  if (!store)
    return 1;
  int rc = 0;
  {
    kv_client client{sys, store};
    auto group = allreduce_group::create(rank, 2, "bench", client, std::chrono::seconds(30),
                                         "127.0.0.1");
    if (!group)
      return std::fprintf(stderr, "rank %u: %s\n", rank, sys.render(group.error()).c_str()), 1;
    auto& g = **group;
    if (shm != (g.shm_to_right() && g.shm_from_left()))
      return std::fprintf(stderr, "rank %u: our ring is not on %s: %s\n", rank,
                          shm ? "shared memory" : "TCP", g.transport().c_str()), 1;
    std::vector<float> ours(floats, static_cast<float>(rank + 1));
    std::vector<float> raw(floats, static_cast<float>(rank + 1)), scratch(floats);
    std::vector<double> ours_s, raw_s;
    thread_usage ours_u, raw_u; // summed over the timed rounds
    raw_counts ours_calls;      // our ring's, as raw_calls
    auto timed = [&](bool which_ours) {
      if (!barrier(fds[0]))
        return false;
      auto u0 = thread_usage::now();
      auto t0 = clock_type::now();
      bool ok = true;
      if (which_ours) {
        if (auto err = g.allreduce_mean(ours.data(), floats)) {
          std::fprintf(stderr, "rank %u: %s\n", rank, sys.render(err).c_str());
          ok = false;
        }
        const auto& c = g.last_call();
        ours_calls.io += c.sends + c.receives + c.empty;
        ours_calls.sleeps += c.sleeps;
      } else {
        ok = shm ? raw_shm_round(rs, rank, raw.data(), floats)
                 : raw_tcp_round(fds[0], rank, raw.data(), floats, scratch.data());
        if (!ok)
          std::fprintf(stderr, "rank %u: the raw exchange broke off\n", rank);
      }
      auto secs = std::chrono::duration<double>(clock_type::now() - t0).count();
      auto u1 = thread_usage::now();
      (which_ours ? ours_s : raw_s).push_back(secs);
      auto& u = which_ours ? ours_u : raw_u;
      u.cpu_us += u1.cpu_us - u0.cpu_us;
      u.switches += u1.switches - u0.switches;
      return ok;
    };
    // For profiling one side alone (perf stat over the pair's processes):
    // ACTORFLOW_BENCH_AR_ONLY=ours or raw; the bench then prints no figures.
    const char* only_env = std::getenv("ACTORFLOW_BENCH_AR_ONLY");
    const std::string only = only_env ? only_env : "";
    const bool run_ours = only != "raw", run_raw = only != "ours";
    for (uint64_t r = 0; r < warmup + rounds && rc == 0; ++r) {
      if (r == warmup)
        ours_s.clear(), raw_s.clear(), ours_u = raw_u = {}, ours_calls = raw_calls = {};
      bool first = r % 2 == 0;
      if (((first ? run_ours : run_raw) && !timed(first))
          || ((first ? run_raw : run_ours) && !timed(!first)))
        rc = 1;
    }
    if (!run_ours || !run_raw) {
      std::fprintf(stderr, "rank %u: one side only (ACTORFLOW_BENCH_AR_ONLY=%s)\n", rank,
                   only.c_str());
      rc = rc == 0 ? 3 : rc; // no figures, no check
    }
    // every element is the mean, 1.5, after the first round (a check of both)
    for (auto* v : {&ours, &raw}) {
      auto [lo, hi] = std::minmax_element(v->begin(), v->end());
      if (rc == 0 && (*lo != 1.5f || *hi != 1.5f)) {
        std::fprintf(stderr, "rank %u: wrong mean (%g..%g) in the %s exchange\n", rank, *lo, *hi,
                     v == &ours ? "our" : "raw");
        rc = 1;
      }
    }
    if (rc == 0 && rank == 0)
      std::printf("ours_seconds %.9f\nraw_seconds %.9f\n", median(ours_s), median(raw_s));
    if (rc == 0 && rounds > 0) // per call, each rank's own
      std::printf("ours_cpu_us %.1f\nours_switches %.2f\nraw_cpu_us %.1f\nraw_switches %.2f\n"
                  "ours_io %.2f\nours_sleeps %.2f\nraw_io %.2f\nraw_sleeps %.2f\n",
                  ours_u.cpu_us / rounds, ours_u.switches / rounds, raw_u.cpu_us / rounds,
                  raw_u.switches / rounds, static_cast<double>(ours_calls.io) / rounds,
                  static_cast<double>(ours_calls.sleeps) / rounds,
                  static_cast<double>(raw_calls.io) / rounds,
                  static_cast<double>(raw_calls.sleeps) / rounds);
  }
  if (rank == 0)
    caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
  ::close(fds[0]);
  ::close(fds[1]);
  return rc;
}

} // namespace

int run_allreduce_helper(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], helper_flag) != 0 || std::strcmp(argv[2], "allreduce-pair") != 0)
    return -1;
  auto a = helper_args::parse(argc, argv, 3);
  return pair_main(a);
}

} // namespace af::bench
