#include "config/loopback.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <fstream>
#include <mutex>
#include <random>

namespace af {

namespace {

sockaddr_in loopback_address(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  return addr;
}

} // namespace

int listen_on_loopback(uint16_t& port, int backlog) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  auto addr = loopback_address(0);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, backlog) != 0
      || getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  port = ntohs(addr.sin_port);
  return fd;
}

bool connect_to_loopback(int fd, uint16_t port) {
  auto addr = loopback_address(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
    return true;
  if (errno != EINTR)
    return false; // EINPROGRESS included: the caller's SO_SNDTIMEO or O_NONBLOCK said so
  // A signal interrupted the wait: the connect goes on, and its outcome is
  // the socket's error once it is writable, within what the socket's send
  // timeout allows (none set: the kernel's SYN retries bound it, as they
  // bound the blocking connect).
  timeval tv{};
  socklen_t tv_len = sizeof(tv);
  int wait_ms = -1;
  if (getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &tv_len) == 0 && (tv.tv_sec > 0 || tv.tv_usec > 0))
    wait_ms = static_cast<int>(tv.tv_sec * 1000 + tv.tv_usec / 1000);
  pollfd p{fd, POLLOUT, 0};
  int n;
  do
    n = poll(&p, 1, wait_ms);
  while (n < 0 && errno == EINTR);
  if (n == 0) {
    errno = ETIMEDOUT;
    return false;
  }
  int err = 0;
  socklen_t len = sizeof(err);
  if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
    return false;
  errno = err;
  return err == 0;
}

int connect_loopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  if (!connect_to_loopback(fd, port)) {
    int why = errno;
    close(fd);
    errno = why;
    return -1;
  }
  return fd;
}

namespace {

/// The start of the kernel's ephemeral range (net.ipv4.ip_local_port_range),
/// where it picks a port for a bind to port 0 and an outgoing connection.
int ephemeral_low() {
  std::ifstream f{"/proc/sys/net/ipv4/ip_local_port_range"};
  int low = 32768; // Linux's default
  if (!(f >> low) || low < 1 || low > 65535)
    return 32768;
  return low;
}

/// Whether 127.0.0.1:`port` can be bound now (no listener, no connection,
/// no TIME_WAIT on it).
bool bindable(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return false;
  auto addr = loopback_address(port);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

} // namespace

uint16_t free_loopback_port() {
  return detail::free_loopback_port(ephemeral_low());
}

uint16_t detail::free_loopback_port(int low) {
  // Below the ephemeral range where there is room: a port the kernel picks
  // there (another server's port 0, any process's outgoing connection) could
  // take this one between now and the caller's bind, which a node started
  // with it would then fail (a flaky test of several processes).
  // Nor twice in a row of this process's last picks: nothing holds a port
  // between the pick and the bind, so a test's four picks for one config
  // would otherwise repeat one about once in 4,000 runs. That holds where
  // the kernel picks too (no room below its range): its binds to port 0
  // repeat as often (21 in 1,000 picks, each within 256 of the other).
  static std::mutex mtx;
  static std::array<uint16_t, 256> recent{};
  static size_t next = 0;
  constexpr int first = 10000; // above the well-known and registered servers most hosts run
  std::lock_guard<std::mutex> guard{mtx};
  auto seen = [&](uint16_t port) {
    return std::find(recent.begin(), recent.end(), port) != recent.end();
  };
  auto keep = [&](uint16_t port) {
    recent[next++ % recent.size()] = port;
    return port;
  };
  if (low - first >= 4096) {
    static std::mt19937 rng{std::random_device{}() ^ static_cast<unsigned>(getpid() * 2654435761u)};
    std::uniform_int_distribution<int> pick{first, low - 1};
    for (int tries = 0; tries < 256; ++tries) {
      auto port = static_cast<uint16_t>(pick(rng));
      if (!seen(port) && bindable(port))
        return keep(port);
    }
  }
  uint16_t port = 0;
  for (int tries = 0; tries < 256; ++tries) {
    port = 0;
    int fd = listen_on_loopback(port, 1);
    if (fd >= 0)
      close(fd);
    if (port != 0 && !seen(port))
      return keep(port);
  }
  return port;
}

} // namespace af
