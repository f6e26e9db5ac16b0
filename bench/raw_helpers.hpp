#pragma once
// What the helper processes of the training and all-reduce metrics share
// (train_helpers.cpp, raw_shm_ps.cpp, allreduce_helpers.cpp): their
// arguments, their sockets, how long they wait for a peer, and the raw
// parameter servers' timed window.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "bench/stats.hpp"
#include "config/loopback.hpp"
#include "net/socket.hpp"

namespace af::bench {

/// How long a baseline's socket may make no progress before the helper
/// gives up (a peer that died or hung): the bench then reports the failure
/// instead of waiting for its own timeout.
constexpr int stall_ms = 30000;

/// A raw baseline's socket: no Nagle, buffers for a whole 4 MiB message,
/// nonblocking.
inline void tune_socket(int fd) {
  sock::set_nodelay(fd);
  // Large enough for a whole 4 MiB message in flight; the kernel caps it at
  // net.core.[rw]mem_max and doubles it.
  sock::set_buffers(fd, 8 << 20);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/// A connection to the helper listening on `port`, which may not listen yet:
/// tries for 2 s.
inline int dial_loopback(uint16_t port) {
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
inline size_t io_slice = SIZE_MAX;

/// One nonblocking read of bytes [done, n) of `buf` (io_slice at most),
/// counted into `done`.
inline io try_read(int fd, char* buf, size_t n, size_t& done) {
  auto r = ::read(fd, buf + done, std::min(n - done, io_slice));
  if (r > 0) {
    done += static_cast<size_t>(r);
    return io::moved;
  }
  if (r < 0 && (errno == EAGAIN || errno == EINTR))
    return io::blocked;
  return io::failed;
}

/// One nonblocking write of bytes [done, n) of `buf` (io_slice at most),
/// counted into `done`.
inline io try_write(int fd, const char* buf, size_t n, size_t& done) {
  auto r = ::write(fd, buf + done, std::min(n - done, io_slice));
  if (r > 0) {
    done += static_cast<size_t>(r);
    return io::moved;
  }
  if (r < 0 && (errno == EAGAIN || errno == EINTR))
    return io::blocked;
  return io::failed;
}

/// key=value arguments of a helper.
struct helper_args {
  std::map<std::string, std::string> kv;

  /// The key=value words of argv from `argv[from]` on (others are passed over).
  static helper_args parse(int argc, char** argv, int from) {
    helper_args a;
    for (int i = from; i < argc; ++i) {
      std::string s = argv[i];
      auto eq = s.find('=');
      if (eq != std::string::npos)
        a.kv[s.substr(0, eq)] = s.substr(eq + 1);
    }
    return a;
  }

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

/// The timed window of a raw ps (the same as actorflow-train's warmup_secs
/// and window_secs): the warm-up starts once every worker has finished a
/// step, the window's steps are counted between two samples, and then the
/// ps ends the run, closing each connection at the end of its step.
struct raw_window {
  double warmup_s = 5, window_s = 15;
  bool started = false, ending = false;
  clock_type::time_point both, t0, t1;
  uint64_t steps0 = 0, steps1 = 0;

  /// Called once per pass of the ps's loop with the steps the job completed
  /// so far (sync: rounds; async: pushes answered) and whether every worker
  /// has finished a step.
  void tick(uint64_t steps, bool all_stepped) {
    if (ending)
      return;
    auto now = clock_type::now();
    if (!started) {
      if (!all_stepped)
        return;
      started = true;
      both = now;
      t0 = both + std::chrono::duration_cast<clock_type::duration>(
                    std::chrono::duration<double>(warmup_s));
      t1 = clock_type::time_point::max();
      return;
    }
    if (t1 == clock_type::time_point::max()) {
      if (now < t0)
        return;
      t0 = now;
      steps0 = steps;
      t1 = t0 + std::chrono::duration_cast<clock_type::duration>(
                  std::chrono::duration<double>(window_s));
      return;
    }
    if (now < t1)
      return;
    t1 = now;
    steps1 = steps;
    ending = true;
  }
  /// How long poll() may wait before the next tick is due (the window's
  /// edges are read on the clock, not only when a byte moves).
  int poll_ms() const {
    if (!started || ending)
      return stall_ms;
    auto next = t1 == clock_type::time_point::max() ? t0 : t1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - clock_type::now());
    return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, stall_ms));
  }
};

/// The raw shared-memory ps and its workers (raw_shm_ps.cpp): shm= names the
/// segment, which the bench makes (raw_shm_segment_bytes, zeros) and removes.
int raw_shm_ps_main(const helper_args& a);
int raw_shm_worker_main(const helper_args& a);

/// The size of the segment of `workers` workers of a model of `floats`.
size_t raw_shm_segment_bytes(size_t floats, size_t workers);

} // namespace af::bench
