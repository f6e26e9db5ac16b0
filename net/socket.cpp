#include "net/socket.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>

namespace af::sock {

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_buffers(int fd, int bytes) {
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

bool set_timeout(int fd, int option, std::chrono::milliseconds t) {
  timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
  return setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv)) == 0;
}

int ms_until(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline
                                                                    - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, std::numeric_limits<int>::max()));
}

int poll_one(int fd, short events, int timeout_ms, short* revents) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds{timeout_ms};
  pollfd pfd{fd, events, 0};
  int rc;
  for (;;) {
    rc = ::poll(&pfd, 1, timeout_ms);
    if (rc >= 0 || errno != EINTR)
      break;
    if (timeout_ms > 0)
      timeout_ms = ms_until(deadline);
  }
  if (revents != nullptr)
    *revents = rc > 0 ? pfd.revents : 0;
  return rc;
}

bool send_all(int fd, const void* p, size_t n, int flags) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    auto r = ::send(fd, c, n, MSG_NOSIGNAL | flags);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n, size_t* got,
              const std::chrono::steady_clock::time_point* until) {
  auto* c = static_cast<char*>(p);
  if (got != nullptr)
    *got = 0;
  while (n > 0) {
    auto r = ::recv(fd, c, n, MSG_WAITALL);
    if (r == 0) {
      errno = ECONNRESET;
      return false;
    }
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    c += r;
    n -= static_cast<size_t>(r);
    if (got != nullptr)
      *got += static_cast<size_t>(r);
    if (n > 0 && until != nullptr && std::chrono::steady_clock::now() >= *until) {
      errno = EAGAIN;
      return false;
    }
  }
  return true;
}

ssize_t send_iov(int fd, const iovec* iov, int count, int flags) {
#ifdef IOV_MAX
  constexpr int max_iov = IOV_MAX;
#else
  constexpr int max_iov = 1024;
#endif
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(std::min(count, max_iov));
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL | flags);
}

bool send_iov_all(int fd, iovec* iov, int count, int flags) {
  while (count > 0) {
    auto n = send_iov(fd, iov, count, flags);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    skip_sent(iov, count, static_cast<size_t>(n));
  }
  return true;
}

io_end transfer_by(int fd, void* buf, size_t n, bool sending,
                   std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    auto r = sending ? ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0 && !sending)
      return io_end::closed;
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return errno == EPIPE || errno == ECONNRESET ? io_end::closed : io_end::failed;
    pollfd pfd{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    auto rc = ::poll(&pfd, 1, ms_until(deadline));
    if (rc == 0)
      return io_end::timed_out;
    if (rc < 0 && errno != EINTR)
      return io_end::failed;
  }
  return io_end::done;
}

uint16_t local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return 0;
  if (addr.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  if (addr.ss_family == AF_INET)
    return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return 0;
}

listener listen_tcp(const std::string& host, uint16_t port, int backlog,
                    const std::function<void(int)>& before) {
  listener out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  auto rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints,
                        &res);
  if (rc != 0) {
    out.resolved = false;
    out.why = gai_strerror(rc);
    return out;
  }
  out.why = "no address";
  for (auto* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      out.why = std::strerror(errno);
      continue;
    }
    if (before)
      before(fd);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, backlog) == 0) {
      out.fd = fd;
      out.port = local_port(fd);
      out.why.clear();
      break;
    }
    out.why = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  return out;
}

} // namespace af::sock
