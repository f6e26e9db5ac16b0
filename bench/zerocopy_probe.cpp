// tcp_4mib_send_zerocopy (issue 24, docs/performance.md): does MSG_ZEROCOPY
// save the send's copy of a 4 MiB message on this host's loopback? Plain
// send() is the baseline; the completions say whether the kernel copied
// anyway (SO_EE_CODE_ZEROCOPY_COPIED), which on loopback it must: the bytes
// end in the receiver's socket buffer either way.
#include "bench/benches.hpp"

#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

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

struct send_result {
  double mbps = 0;
  long completions = 0;
  long copied = 0; ///< completions for which the kernel copied after all
  bool ok = false;
};

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

/// `rounds` messages of `bytes` over a fresh loopback connection to a thread
/// that reads them; MB/s of the sender.
send_result send_messages(bool zerocopy, size_t bytes, int rounds) {
  send_result r;
  uint16_t port = 0;
  int lfd = listen_on_loopback(port, 1);
  if (lfd < 0)
    return r;
  std::thread reader{[lfd, bytes, rounds] {
    int c = accept(lfd, nullptr, nullptr);
    std::vector<char> in(bytes);
    for (int i = 0; c >= 0 && i < rounds; ++i)
      if (!sock::recv_all(c, in.data(), bytes))
        break;
    if (c >= 0)
      close(c);
  }};
  int fd = connect_loopback(port);
  std::vector<char> out(bytes, 1);
  int one = 1;
  bool ready = fd >= 0 && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0
               && (!zerocopy || setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) == 0);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; ready && i < rounds; ++i) {
    size_t sent = 0;
    while (ready && sent < bytes) {
      auto k = send(fd, out.data() + sent, bytes - sent, zerocopy ? MSG_ZEROCOPY : 0);
      ready = k > 0;
      sent += ready ? static_cast<size_t>(k) : 0;
    }
    if (zerocopy)
      reap(fd, r);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (fd >= 0)
    close(fd);
  reader.join();
  close(lfd);
  r.ok = ready;
  r.mbps = static_cast<double>(bytes) * rounds / 1e6 / s;
  return r;
}

} // namespace

int zerocopy_bench(int reps) {
  constexpr size_t bytes = size_t{4} << 20;
  constexpr int rounds = 200;
  std::vector<double> plain, zc;
  long completions = 0, copied = 0;
  for (int rep = 0; rep < reps; ++rep) { // alternating
    auto p = send_messages(false, bytes, rounds);
    auto z = send_messages(true, bytes, rounds);
    if (!p.ok || !z.ok) {
      std::printf("metric tcp_4mib_send_zerocopy skipped: %s\n",
                  p.ok ? "MSG_ZEROCOPY sends failed (kernel without SO_ZEROCOPY?)"
                       : "loopback sends failed");
      return 0;
    }
    plain.push_back(p.mbps);
    zc.push_back(z.mbps);
    completions += z.completions;
    copied += z.copied;
  }
  std::sort(plain.begin(), plain.end());
  std::sort(zc.begin(), zc.end());
  double o = zc[zc.size() / 2], b = plain[plain.size() / 2];
  std::printf("# tcp_4mib_send_zerocopy: 4 MiB sends over loopback TCP with MSG_ZEROCOPY against "
              "plain send(); %ld of %ld completions say the kernel copied anyway\n",
              copied, completions);
  std::printf("metric tcp_4mib_send_zerocopy ours=%.3f baseline=%.3f unit=MB/s ratio=%.3f\n", o, b,
              o / b);
  std::fflush(stdout);
  return 0;
}

} // namespace af::bench
