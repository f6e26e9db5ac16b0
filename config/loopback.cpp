#include "config/loopback.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>

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

uint16_t free_loopback_port() {
  uint16_t port = 0;
  int fd = listen_on_loopback(port, 1);
  if (fd >= 0)
    close(fd);
  return port;
}

} // namespace af
