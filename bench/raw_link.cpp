// The raw TCP peer's side (bench/raw_link.hpp): what the forked child runs.
#include "bench/raw_link.hpp"

namespace af::bench {

/// Serves commands {op, count, size} on one connection until it closes.
void raw_serve(int fd) {
  sock::set_nodelay(fd);
  std::vector<char> buf(1 << 20);
  std::vector<char> whole; // 'W' and 'R': one buffer of the transfer's size, kept
  struct { char op; uint64_t count; uint64_t size; } cmd;
  while (sock::recv_all(fd, &cmd, sizeof(cmd))) {
    if (cmd.op == 'p') {
      for (uint64_t i = 0; i < cmd.count; ++i)
        if (!sock::recv_all(fd, buf.data(), cmd.size) || !sock::send_all(fd, buf.data(), cmd.size))
          _exit(1);
    } else if (cmd.op == 'w') { // parent writes size bytes, we ack
      for (uint64_t left = cmd.size; left > 0;) {
        auto r = ::read(fd, buf.data(), std::min<uint64_t>(left, buf.size()));
        if (r <= 0)
          _exit(1);
        left -= static_cast<uint64_t>(r);
      }
      char ack = 1;
      sock::send_all(fd, &ack, 1);
    } else if (cmd.op == 'r') { // we write size bytes
      for (uint64_t left = cmd.size; left > 0;) {
        auto n = std::min<uint64_t>(left, buf.size());
        if (!sock::send_all(fd, buf.data(), n))
          _exit(1);
        left -= n;
      }
    } else if (cmd.op == 'W' || cmd.op == 'R') {
      // Buffer to buffer: the whole transfer lands in (or leaves from) one
      // buffer of its size, allocated once and pre-faulted, as a tensor's
      // bytes would; 'W': we receive and ack, 'R': we send.
      if (whole.size() != cmd.size)
        whole.assign(cmd.size, 'b');
      bool moved = cmd.op == 'R' ? sock::send_all(fd, whole.data(), whole.size())
                                 : sock::recv_all(fd, whole.data(), whole.size());
      if (!moved)
        _exit(1);
      if (cmd.op == 'W') {
        char ack = 1;
        sock::send_all(fd, &ack, 1);
      }
    }
  }
  close(fd);
}

/// The child: a thread per connection; exits when the first connection (the
/// parent's control link) closes.
[[noreturn]] void raw_peer(int listen_fd) {
  int first = accept(listen_fd, nullptr, nullptr);
  std::thread{[listen_fd] {
    for (;;) {
      int fd = accept(listen_fd, nullptr, nullptr);
      if (fd < 0)
        return;
      std::thread{raw_serve, fd}.detach();
    }
  }}.detach();
  raw_serve(first);
  _exit(0);
}

} // namespace af::bench
