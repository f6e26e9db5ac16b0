#include "net/tcp_connect.hpp"
#include "net/socket.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "messages/error.hpp"

namespace af {

namespace {

using addrinfo_ptr = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

/// A name lookup that a thread of its own runs: getaddrinfo takes no
/// timeout (the resolver's own is resolv.conf's timeout x attempts per
/// server, seconds). A caller past its deadline leaves it; the thread ends
/// in the resolver's time and frees what it found.
struct address_lookup {
  std::mutex mtx;
  std::condition_variable cv;
  bool done = false;
  int rc = 0;
  addrinfo* found = nullptr;
  ~address_lookup() {
    if (found != nullptr)
      ::freeaddrinfo(found);
  }
};

/// The addresses of `host`:`port` by `deadline`. A numeric address is
/// converted without a lookup.
caf::expected<addrinfo_ptr> resolve_by(const std::string& host, uint16_t port,
                                       std::chrono::steady_clock::time_point deadline,
                                       std::chrono::milliseconds budget) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_NUMERICHOST;
  auto service = std::to_string(port);
  auto failed = [&](int rc) {
    return make_error(af_error::unreachable, "cannot resolve '" + host + "': " + ::gai_strerror(rc)
                                               + " (check the host in the cluster config)");
  };
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc == 0)
    return addrinfo_ptr{found, ::freeaddrinfo};
  if (rc != EAI_NONAME)
    return failed(rc);
  hints.ai_flags = AI_NUMERICSERV;
  auto lookup = std::make_shared<address_lookup>();
  try {
    std::thread{[lookup, host, service, hints] {
      addrinfo* res = nullptr;
      int res_rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
      std::lock_guard<std::mutex> guard{lookup->mtx};
      lookup->rc = res_rc;
      lookup->found = res;
      lookup->done = true;
      lookup->cv.notify_all();
    }}.detach();
  } catch (const std::system_error&) {
    // No thread to spare: look it up here, bounded by the resolver alone.
    rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    if (rc != 0)
      return failed(rc);
    return addrinfo_ptr{found, ::freeaddrinfo};
  }
  std::unique_lock<std::mutex> lock{lookup->mtx};
  if (!lookup->cv.wait_until(lock, deadline, [&] { return lookup->done; }))
    return make_error(af_error::unreachable,
                      "looking up the name '" + host + "' took longer than the connect's "
                        + std::to_string(budget.count())
                        + " ms (check the resolver, /etc/resolv.conf, or put an IP address "
                          "in the cluster config)");
  if (lookup->rc != 0)
    return failed(lookup->rc);
  return addrinfo_ptr{std::exchange(lookup->found, nullptr), ::freeaddrinfo};
}

} // namespace

caf::expected<int> tcp_connect(const std::string& host, uint16_t port,
                               std::chrono::steady_clock::time_point deadline,
                               std::chrono::milliseconds timeout, const char* timeout_name,
                               const std::function<void(int)>& before) {
  auto found = resolve_by(host, port, deadline, timeout);
  if (!found)
    return std::move(found.error());
  std::string why = "no address";
  for (auto* ai = found->get(); ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                      ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    if (before)
      before(fd);
    int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      // Each address gets what is left of the one budget, not a budget each;
      // a signal during the wait is not the peer's answer: wait on.
      pollfd p{fd, POLLOUT, 0};
      int n = 0;
      do {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
        n = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
      } while (n < 0 && errno == EINTR);
      socklen_t len = sizeof(err);
      if (n == 1) {
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = errno;
      } else
        err = n == 0 ? ETIMEDOUT : errno;
    }
    if (err == 0) {
      sock::set_nodelay(fd);
      return fd;
    }
    if (err == ETIMEDOUT)
      why = "the TCP connection was not accepted within " + std::to_string(timeout.count())
            + " ms (" + (timeout_name != nullptr ? std::string{timeout_name} + "; " : std::string{})
            + "a host that is down, a wrong address, or a firewall that drops the packets)";
    else if (err == ECONNREFUSED)
      why = "connection refused (nothing listens on that port)";
    else
      why = std::strerror(err);
    ::close(fd);
  }
  return make_error(af_error::unreachable, why);
}

} // namespace af
