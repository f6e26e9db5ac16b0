#include "fuzz/harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "net/data_plane.hpp"
#include "actors/variable_directory.hpp"
#include "actors/variable.hpp"
#include "messages/error.hpp"
#include "config/loopback.hpp"

// The data plane's harness, apart from the parsers' (harness.cpp): it needs
// the whole actorflow library, they do not.
namespace af::fuzz {

namespace {

using clock_type = std::chrono::steady_clock;

/// One server for the process, with a scalar variable "v" to read.
struct plane_fixture {
  std::shared_ptr<variable_directory> dir = std::make_shared<variable_directory>();
  std::unique_ptr<data_plane_server> server;
  std::string problem;

  plane_fixture() {
    auto cell = std::make_shared<variable_cell>(
      variable_spec{"v", dtype::float32, {}, "/job:ps/replica:0/task:0/device:CPU:0"});
    if (!cell->initialize(initializer::constant(5), false, "")) {
      problem = "cannot initialize the fuzz variable";
      return;
    }
    dir->put("v", {variable_cell_actor{}, cell});
    data_plane_timeouts timeouts;
    timeouts.idle = std::chrono::seconds{5};
    timeouts.frame = std::chrono::seconds{1};
    auto srv = data_plane_server::start(dir, "127.0.0.1", 0, "fuzz node", timeouts);
    if (!srv) {
      problem = "cannot start the data plane: " + describe(srv.error());
      return;
    }
    server = std::move(*srv);
  }
};

plane_fixture& fixture() {
  static auto* f = new plane_fixture; // lives as long as the process
  return *f;
}

} // namespace

std::string data_plane(const uint8_t* data, size_t size) {
  auto& f = fixture();
  if (!f.problem.empty())
    return f.problem;
  int fd = connect_loopback(f.server->port());
  if (fd < 0)
    return "the data plane refused a connection: " + std::string{std::strerror(errno)};
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  // Send everything while reading what comes back (a reply must not fill
  // the socket while we write), then close for writing: the server must see
  // the end and close its side within the frame timeout and then some.
  size_t sent = 0;
  bool write_open = true;
  bool closed = false;
  auto deadline = clock_type::now() + std::chrono::seconds{5};
  char buf[65536];
  while (!closed && clock_type::now() < deadline) {
    if (write_open && sent == size) {
      shutdown(fd, SHUT_WR);
      write_open = false;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (write_open ? POLLOUT : 0)), 0};
    if (poll(&p, 1, 100) < 0 && errno != EINTR)
      break;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      auto got = recv(fd, buf, sizeof(buf), 0);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
        closed = true;
    }
    if (write_open && (p.revents & POLLOUT)) {
      auto put = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (put > 0)
        sent += static_cast<size_t>(put);
      else if (put < 0 && errno != EAGAIN && errno != EINTR)
        write_open = false; // the server closed on us: fine, it refused the input
    }
  }
  close(fd);
  if (!closed)
    return "the data plane kept a connection open 5 s after its peer stopped sending";
  // It still serves. (libFuzzer's SIGALRM timer interrupts connects now
  // and then: both connects here must wait through EINTR, not report it.)
  auto ch = data_channel::connect("127.0.0.1", f.server->port(), "fuzz node",
                                  std::chrono::seconds{5});
  if (!ch)
    return "the data plane no longer accepts after the input: " + describe(ch.error());
  auto r = (*ch)->call(var_op::read, "v", nullptr, false);
  if (!r)
    return "the data plane no longer serves a read after the input: " + describe(r.error());
  if (r->first.type() != dtype::float32 || !r->first.shape().empty())
    return "the variable read back is " + r->first.summary() + ", not a float32 scalar";
  return {};
}

} // namespace af::fuzz
