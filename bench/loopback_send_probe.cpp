// tcp_4mib_send_zerocopy and tcp_4mib_send_splice (issue 24,
// docs/performance.md "MSG_ZEROCOPY and splice"): does MSG_ZEROCOPY, or
// vmsplice + splice, save the send's copy of a 4 MiB message on this host's
// loopback? Plain send() is the baseline of both. MSG_ZEROCOPY's completions
// say whether the kernel copied anyway (SO_EE_CODE_ZEROCOPY_COPIED), which on
// loopback it must. A spliced page is not copied on the way (the receiver's
// recv copies it out), so the splice line also gives each thread's CPU per MB.
#include "bench/benches.hpp"

#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/stats.hpp"
#include "config/loopback.hpp"
#include "net/socket.hpp"

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

namespace af::bench {

namespace {

/// How the sender hands its bytes to the socket.
enum class send_method { plain, zerocopy, splice };

struct send_result {
  double mbps = 0;
  double sender_cpu_us_per_mb = 0, receiver_cpu_us_per_mb = 0;
  long completions = 0;
  long copied = 0;      ///< completions for which the kernel copied after all
  int pipe_bytes = 0;   ///< splice: the pipe's size, as the kernel granted it
  std::string failure;  ///< what failed, with its errno's words; empty if it worked
};

/// The calling thread's CPU time (user and system), in microseconds.
double thread_cpu_us() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6
         + static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// "what: strerror(errno)", read at once, before another call moves errno.
std::string failed(const char* what) {
  return std::string{what} + ": " + std::strerror(errno);
}

/// Reaps MSG_ZEROCOPY completions from `fd`'s error queue, without waiting.
void reap(int fd, send_result& r) {
  for (;;) {
    char ctrl[128];
    msghdr m{};
    m.msg_control = ctrl;
    m.msg_controllen = sizeof(ctrl);
    if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
      return;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      auto* e = reinterpret_cast<sock_extended_err*>(CMSG_DATA(c));
      if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY)
        continue;
      r.completions += 1;
      if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED)
        r.copied += 1;
    }
  }
}

/// A pipe for vmsplice + splice, as large as the system lets it be.
struct splice_pipe {
  int r = -1, w = -1;
  int bytes = 0; ///< its size (F_GETPIPE_SZ)
  std::string failure;

  splice_pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      failure = failed("pipe2");
      return;
    }
    r = fds[0];
    w = fds[1];
    // 1 MiB, /proc/sys/fs/pipe-max-size's default; the pipe keeps its
    // 64 KiB where that is refused, and the line says which it got.
    fcntl(w, F_SETPIPE_SZ, 1 << 20);
    bytes = fcntl(w, F_GETPIPE_SZ);
  }
  ~splice_pipe() {
    if (r >= 0)
      close(r);
    if (w >= 0)
      close(w);
  }
  splice_pipe(const splice_pipe&) = delete;
  splice_pipe& operator=(const splice_pipe&) = delete;

  /// `n` bytes of `data` into `fd` without copying them on the way: the
  /// pages go by reference into the pipe and from it into the socket, so
  /// they must not change until the peer has read them (here: never).
  bool send(int fd, const char* data, size_t n) {
    for (size_t sent = 0; sent < n;) {
      iovec v{const_cast<char*>(data + sent), n - sent};
      auto queued = vmsplice(w, &v, 1, 0);
      if (queued <= 0) {
        failure = failed("vmsplice");
        return false;
      }
      for (auto left = static_cast<size_t>(queued); left > 0;) {
        auto k = splice(r, nullptr, fd, nullptr, left, 0);
        if (k <= 0) {
          failure = failed("splice into the socket");
          return false;
        }
        left -= static_cast<size_t>(k);
      }
      sent += static_cast<size_t>(queued);
    }
    return true;
  }
};

/// `rounds` messages of `bytes` over a fresh loopback connection to a thread
/// that reads them: MB/s of the sender, and each thread's CPU per MB (on
/// loopback the receiving side's TCP work runs mostly in the sender's
/// thread, as a softirq after its send).
send_result send_messages(send_method method, size_t bytes, int rounds) {
  send_result r;
  uint16_t port = 0;
  int lfd = listen_on_loopback(port, 1);
  if (lfd < 0)
    return r.failure = failed("listen on loopback"), r;
  double reader_cpu_us = 0;
  std::vector<char> in(bytes), out(bytes, 1); // both before a call whose errno is read
  std::thread reader{[lfd, bytes, rounds, &reader_cpu_us, &in] {
    int c = accept(lfd, nullptr, nullptr);
    if (c < 0) { // the connection waiting in the queue is reset: the sender's send fails
      shutdown(lfd, SHUT_RDWR);
      return;
    }
    double cpu0 = thread_cpu_us();
    for (int i = 0; i < rounds; ++i)
      if (!sock::recv_all(c, in.data(), bytes))
        break;
    reader_cpu_us = thread_cpu_us() - cpu0;
    close(c);
  }};
  splice_pipe pipe;
  int fd = connect_loopback(port);
  int one = 1;
  if (fd < 0)
    r.failure = failed("connect on loopback");
  else if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    r.failure = failed("TCP_NODELAY");
  else if (method == send_method::zerocopy
           && setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) != 0)
    r.failure = failed("SO_ZEROCOPY (a kernel without MSG_ZEROCOPY?)");
  else if (method == send_method::splice && !pipe.failure.empty())
    r.failure = pipe.failure;
  auto t0 = std::chrono::steady_clock::now();
  double cpu0 = thread_cpu_us();
  for (int i = 0; r.failure.empty() && i < rounds; ++i) {
    if (method == send_method::splice) {
      if (!pipe.send(fd, out.data(), bytes))
        r.failure = pipe.failure;
      continue;
    }
    for (size_t sent = 0; r.failure.empty() && sent < bytes;) {
      auto k = send(fd, out.data() + sent, bytes - sent,
                    MSG_NOSIGNAL | (method == send_method::zerocopy ? MSG_ZEROCOPY : 0));
      if (k < 0)
        r.failure = failed("send");
      else if (k == 0)
        r.failure = "send moved no byte";
      else
        sent += static_cast<size_t>(k);
    }
    if (method == send_method::zerocopy)
      reap(fd, r);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double sender_cpu_us = thread_cpu_us() - cpu0;
  if (fd >= 0)
    close(fd);
  else
    shutdown(lfd, SHUT_RDWR); // the reader's accept() returns (EINVAL, on Linux)
  reader.join();
  close(lfd);
  const double mb = static_cast<double>(bytes) * rounds / 1e6;
  r.mbps = mb / s;
  r.sender_cpu_us_per_mb = sender_cpu_us / mb;
  r.receiver_cpu_us_per_mb = reader_cpu_us / mb;
  r.pipe_bytes = pipe.bytes;
  return r;
}

/// SIGPIPE ignored while it lives, then as it was (the children the bench
/// starts later inherit the disposition).
class sigpipe_ignored {
public:
  sigpipe_ignored() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &before_);
  }
  ~sigpipe_ignored() { sigaction(SIGPIPE, &before_, nullptr); }
  sigpipe_ignored(const sigpipe_ignored&) = delete;
  sigpipe_ignored& operator=(const sigpipe_ignored&) = delete;

private:
  struct sigaction before_ {};
};

} // namespace

int send_probe_bench(const wanted_fn& wanted, int reps) {
  constexpr size_t bytes = size_t{4} << 20;
  constexpr int rounds = 200;
  const bool zc_line = wanted("tcp_4mib_send_zerocopy");
  const bool splice_line = wanted("tcp_4mib_send_splice");
  // A splice into a socket whose reader left raises SIGPIPE (it has no
  // MSG_NOSIGNAL): the failure is reported, not the bench killed.
  sigpipe_ignored quiet;
  std::vector<double> plain, zc, sp, plain_send_cpu, plain_recv_cpu, sp_send_cpu, sp_recv_cpu;
  long completions = 0, copied = 0;
  int pipe_bytes = 0;
  std::string plain_failure, zc_failure, sp_failure;
  for (int rep = 0; rep < reps && plain_failure.empty(); ++rep) { // alternating
    auto p = send_messages(send_method::plain, bytes, rounds);
    if (!p.failure.empty()) {
      plain_failure = "plain sends failed: " + p.failure;
      break;
    }
    plain.push_back(p.mbps);
    plain_send_cpu.push_back(p.sender_cpu_us_per_mb);
    plain_recv_cpu.push_back(p.receiver_cpu_us_per_mb);
    if (zc_line && zc_failure.empty()) {
      auto z = send_messages(send_method::zerocopy, bytes, rounds);
      zc_failure = z.failure;
      zc.push_back(z.mbps);
      completions += z.completions;
      copied += z.copied;
    }
    if (splice_line && sp_failure.empty()) {
      auto x = send_messages(send_method::splice, bytes, rounds);
      sp_failure = x.failure;
      sp.push_back(x.mbps);
      sp_send_cpu.push_back(x.sender_cpu_us_per_mb);
      sp_recv_cpu.push_back(x.receiver_cpu_us_per_mb);
      pipe_bytes = x.pipe_bytes;
    }
  }
  const double b = median(plain);
  if (zc_line) {
    if (const auto& why = !plain_failure.empty() ? plain_failure : zc_failure; !why.empty()) {
      std::printf("metric tcp_4mib_send_zerocopy skipped: %s\n", why.c_str());
    } else {
      std::printf("# tcp_4mib_send_zerocopy: 4 MiB sends over loopback TCP with MSG_ZEROCOPY "
                  "against plain send(); %ld of %ld completions say the kernel copied anyway\n",
                  copied, completions);
      report("tcp_4mib_send_zerocopy", median(zc), b, "MB/s");
    }
  }
  if (splice_line) {
    if (const auto& why = !plain_failure.empty() ? plain_failure : sp_failure; !why.empty()) {
      std::printf("metric tcp_4mib_send_splice skipped: %s\n", why.c_str());
    } else {
      std::printf("# tcp_4mib_send_splice: 4 MiB sends over loopback TCP by vmsplice + splice "
                  "through a pipe of %d KiB (the pages by reference, no copy on the way) against "
                  "plain send(); CPU per MB (us), sending thread / receiving thread: splice %.0f / "
                  "%.0f, send() %.0f / %.0f\n",
                  pipe_bytes / 1024, median(sp_send_cpu), median(sp_recv_cpu),
                  median(plain_send_cpu), median(plain_recv_cpu));
      report("tcp_4mib_send_splice", median(sp), b, "MB/s");
    }
  }
  std::fflush(stdout);
  return 0;
}

} // namespace af::bench
