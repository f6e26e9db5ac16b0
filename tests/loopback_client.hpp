#pragma once
/// A plain TCP client of a server on 127.0.0.1, for the tests that speak to
/// a port byte by byte (tests/test_wire.cpp) and the data plane's fuzz
/// harness (fuzz/harness_plane.cpp): one copy of the set-up for both.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace af::testing {

/// A TCP connection to 127.0.0.1:`port`; -1 if there is no socket or the
/// connection is refused (errno says why).
inline int connect_loopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int why = errno;
    close(fd);
    errno = why;
    return -1;
  }
  return fd;
}

} // namespace af::testing
