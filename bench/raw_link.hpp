#pragma once
// The raw TCP peer, the baseline of most actorflow-bench metrics: a forked
// process (no exec: it runs raw_peer) that echoes, sinks and sources bytes on
// loopback as plain sockets allow, and this process's link to it.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench_util.hpp"
#include "config/loopback.hpp"
#include "net/socket.hpp"

namespace af::bench {

// -- raw TCP peer (its bytes move through net/socket.hpp's loops) ---------------

/// Serves commands {op, count, size} on one connection until it closes.
void raw_serve(int fd);

/// The child: a thread per connection; exits when the first connection (the
/// parent's control link) closes.
[[noreturn]] void raw_peer(int listen_fd);

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
    int s = af::connect_loopback(port);
    sock::set_nodelay(s);
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
          sock::send_all(fdi, &cmd, sizeof(cmd));
          sock::send_all(fdi, buf.data(), bytes);
          sock::recv_all(fdi, &ack, 1);
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
    sock::send_all(fd, &cmd, sizeof(cmd));
  }

  /// Announces `rounds` echoes of `size` bytes; then call echo_us() that often.
  void start_echoes(int rounds, size_t size) {
    echo_buf.resize(size);
    command('p', static_cast<uint64_t>(rounds), size);
  }

  /// One round trip, in microseconds.
  double echo_us() {
    auto t0 = clock_type::now();
    sock::send_all(fd, echo_buf.data(), echo_buf.size());
    sock::recv_all(fd, echo_buf.data(), echo_buf.size());
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
  }

  std::vector<char> echo_buf;

  /// MB/s of sending `bytes` (and getting a 1-byte ack) / of receiving them.
  double stream_mbps(size_t bytes, bool upload, std::vector<char>& buf) {
    auto t0 = clock_type::now();
    command(upload ? 'w' : 'r', 1, bytes);
    if (upload) {
      for (size_t off = 0; off < bytes; off += buf.size())
        sock::send_all(fd, buf.data(), std::min(buf.size(), bytes - off));
      char ack;
      sock::recv_all(fd, &ack, 1);
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
    if (upload)
      sock::send_all(fd, whole.data(), whole.size());
    else
      sock::recv_all(fd, whole.data(), whole.size());
    if (upload) {
      char ack;
      sock::recv_all(fd, &ack, 1);
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

} // namespace af::bench
