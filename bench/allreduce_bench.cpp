// The all-reduce metrics of actorflow-bench (allreduce_bench.hpp): our ring
// (dist/allreduce.hpp) against a raw exchange of the same bytes, and the
// helper processes both run in (this binary, re-executed with helper_flag).
// Moved here from bench_train.cpp and train_helpers.cpp; the small process
// and socket helpers below are copies of theirs (spawn, wait_all, the
// nonblocking reads and writes), so that neither file needs to export them.
#include "bench/allreduce_bench.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/middleman.hpp"

#include "actors/kv_store.hpp"
#include "actors/system.hpp"
#include "bench/train_common.hpp"
#include "config/loopback.hpp"
#include "core/child_process.hpp"
#include "dist/allreduce.hpp"
#include "net/socket.hpp"

namespace af::bench {

namespace {

// -- processes (as in bench_train.cpp) ---------------------------------------------------

/// A child: `args` exec'd with stdout and stderr into `log`, every other
/// descriptor closed but `keep`, killed if the bench dies.
child_process spawn(const std::vector<std::string>& args, const std::filesystem::path& log,
                    int keep = -1) {
  child_spec spec;
  spec.argv = args;
  spec.out = spec.err = child_output::file;
  spec.log_path = log.string();
  spec.close_fds = true;
  spec.keep_fd = keep;
  return child_process{spec};
}

/// Why a group of children failed: which one failed first, and how.
struct group_failure {
  size_t who = 0;
  std::string why;
};

/// Waits for every child until `deadline` (sooner once one has failed: its
/// peers would wait for it in vain) and kills those left.
std::optional<group_failure> wait_all(std::vector<child_process>& kids,
                                      const std::vector<std::string>& names,
                                      clock_type::time_point deadline) {
  std::vector<bool> done(kids.size(), false);
  std::optional<group_failure> failure;
  for (;;) {
    bool pending = false;
    for (size_t i = 0; i < kids.size(); ++i) {
      if (done[i])
        continue;
      auto status = kids[i].try_wait();
      if (!status) {
        pending = true;
        continue;
      }
      done[i] = true;
      bool ok = WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
      if (!ok && !failure) {
        failure = group_failure{i, names[i] + " " + child_process::describe(*status)};
        deadline = std::min(deadline, clock_type::now() + std::chrono::seconds(5));
      }
    }
    if (!pending)
      return failure;
    if (clock_type::now() > deadline) {
      for (size_t i = 0; i < kids.size(); ++i)
        if (!done[i]) {
          kids[i].signal(SIGKILL);
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

// -- sockets (as in train_helpers.cpp) ---------------------------------------------------

constexpr size_t chunk_bytes = 64 << 10; // the raw exchange's unit of averaging (scheme=swap)

void tune_socket(int fd) {
  sock::set_nodelay(fd);
  // Large enough for a whole 4 MiB message in flight; the kernel caps it at
  // net.core.[rw]mem_max and doubles it.
  sock::set_buffers(fd, 8 << 20);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/// A connection to the helper listening on `port`, which may not listen yet:
/// tries for 2 s.
int dial_loopback(uint16_t port) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    int fd = connect_loopback(port);
    if (fd >= 0)
      return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
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

// -- the helpers ----------------------------------------------------------------------

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

// -- the metric -----------------------------------------------------------------------

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
  std::vector<child_process> pids;
  pids.push_back(spawn(args(0), dir.path / "raw-ar0.log", lfd));
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

/// MB/s of our 2-rank allreduce_mean of the 4 MiB buffer, rank 0's median.
std::optional<double> ours_allreduce(const train_bench_options& o, const scratch_dir& dir,
                                     std::string& failure) {
  auto self = self_exe();
  auto port = free_loopback_port();
  std::vector<child_process> pids;
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

const std::vector<std::string>& allreduce_metrics() {
  static const std::vector<std::string> names{"allreduce_4mib_2w"};
  return names;
}

void run_allreduce_benches(const std::vector<std::string>& wanted, const train_bench_options& opts) {
  scratch_dir dir;
  if (dir.path.empty()) {
    std::printf("# all-reduce metrics: skipped (no scratch folder in /tmp)\n");
    return;
  }
  if (std::find(wanted.begin(), wanted.end(), "allreduce_4mib_2w") != wanted.end())
    bench_allreduce(opts, dir);
}

int run_allreduce_helper(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], helper_flag) != 0)
    return -1;
  std::string role = argv[2];
  if (role != "raw-allreduce" && role != "allreduce")
    return -1;
  helper_args a;
  for (int i = 3; i < argc; ++i) {
    std::string s = argv[i];
    auto eq = s.find('=');
    if (eq != std::string::npos)
      a.kv[s.substr(0, eq)] = s.substr(eq + 1);
  }
  if (a.kv.count("slice")) // 0: unlimited
    io_slice = a.num("slice") ? a.num("slice") : SIZE_MAX;
  return role == "raw-allreduce" ? raw_allreduce_main(a) : allreduce_main(a);
}

} // namespace af::bench
