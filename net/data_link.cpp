#include "net/data_link.hpp"
#include "net/tls.hpp"
#include "net/tls_io.hpp"

#include <limits.h>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "messages/error.hpp"

namespace af::plane_io {

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

thread_local std::string last_tls_error;
thread_local tls_failure last_tls_failure = tls_failure::none;

void note_failure(const secure_stream& tls) {
  if (!tls.reason().empty()) {
    last_tls_error = tls.reason();
    last_tls_failure = tls.failure();
  }
}

namespace {

bool write_all(int fd, iovec* iov, int count);

/// How often a bounded send looks at its cancel flag while the peer reads nothing.
constexpr int cancel_slice_ms = 20;

} // namespace

long long ms_left(const send_bound& b) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                b.deadline - std::chrono::steady_clock::now())
                .count();
  return std::max<long long>(left, 0);
}

namespace {

/// Moves `iov` past the `n` bytes a send took.
void skip_sent(iovec*& iov, int& count, size_t n) {
  while (count > 0 && n >= iov->iov_len) {
    n -= iov->iov_len;
    ++iov;
    --count;
  }
  if (count > 0) {
    iov->iov_base = static_cast<char*>(iov->iov_base) + n;
    iov->iov_len -= n;
  }
}

/// One sendmsg of `iov`'s first buffers (never a SIGPIPE). sendmsg takes
/// at most IOV_MAX (1024) buffers: a frame of more parts (a push of a model
/// cut into many pieces) goes in several calls, not EMSGSIZE.
ssize_t send_iov(int fd, iovec* iov, int count, int flags) {
#ifdef IOV_MAX
  constexpr int max_iov = IOV_MAX;
#else
  constexpr int max_iov = 1024;
#endif
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(std::min(count, max_iov));
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL | flags);
}

/// write_all of a plaintext socket within `b`: non-blocking sends, and a poll
/// for room (at most until the deadline) when the peer's window is full.
bool write_bounded(int fd, iovec* iov, int count, const send_bound& b) {
  while (count > 0) {
    auto n = send_iov(fd, iov, count, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return false;
      for (;;) {
        if (b.cancel != nullptr && b.cancel->load()) {
          errno = ECANCELED;
          return false;
        }
        auto left = ms_left(b);
        if (left <= 0) {
          errno = EAGAIN;
          return false;
        }
        pollfd pfd{fd, POLLOUT, 0};
        int wait = static_cast<int>(std::min<long long>(
          left, b.cancel != nullptr ? cancel_slice_ms : std::numeric_limits<int>::max()));
        int rc = ::poll(&pfd, 1, wait);
        if (rc > 0)
          break; // room (or an error, which the next send reports)
        if (rc < 0 && errno != EINTR)
          return false;
      }
      continue;
    }
    skip_sent(iov, count, static_cast<size_t>(n));
  }
  return true;
}

/// errno for a shared-memory transfer that did not finish (0 if it did).
int shm_errno(shm_channel::status st) {
  switch (st) {
    case shm_channel::status::done:
      return 0;
    case shm_channel::status::closed:
      return ECONNRESET;
    case shm_channel::status::idle:
    case shm_channel::status::timeout:
      return EAGAIN;
    case shm_channel::status::cancelled:
      return ECANCELED;
    case shm_channel::status::corrupt:
      return EBADMSG;
  }
  return EIO;
}

/// The bound of a wait on `io`'s rings: `b`'s deadline and cancel flag (a
/// client's send), else the link's own.
shm_channel::bound shm_bound(const link& io, const send_bound* b = nullptr) {
  shm_channel::bound sb;
  sb.deadline = b != nullptr ? b->deadline : io.deadline;
  sb.cancel = b != nullptr ? b->cancel : io.cancel;
  sb.stall_ms = io.stall_ms;
  sb.spin = io.spin;
  return sb;
}

} // namespace

bool write_all(const link& io, iovec* iov, int count, const send_bound* b) {
  if (io.ucx != nullptr || io.shm != nullptr) {
    int err = shm_errno(io.ucx != nullptr ? io.ucx->write(iov, count, io.fd, shm_bound(io, b))
                                          : io.shm->write(iov, count, io.fd, shm_bound(io, b)));
    errno = err;
    return err == 0;
  }
  if (io.tls != nullptr) {
    bool ok = true;
    if (b == nullptr) {
      ok = io.tls->write(iov, count);
    } else {
      // The record layer sends blocking, each wait bounded by SO_SNDTIMEO:
      // a large part goes in slices of whole records (so the records are the
      // ones one write would make), the socket's send wait set to what is
      // left of the deadline before each, and the cancel flag looked at.
      constexpr size_t slice = 4 * secure_stream::max_record_bytes;
      int first = 0;
      auto check = [&]() {
        if (b->cancel != nullptr && b->cancel->load()) {
          errno = ECANCELED;
          return false;
        }
        auto left = ms_left(*b);
        if (left <= 0) {
          errno = EAGAIN;
          return false;
        }
        set_timeout(io.fd, SO_SNDTIMEO, std::chrono::milliseconds{left});
        return true;
      };
      for (int i = 0; i < count && ok; ++i) {
        if (iov[i].iov_len <= slice)
          continue;
        if (i > first)
          ok = check() && io.tls->write(iov + first, i - first);
        auto* p = static_cast<char*>(iov[i].iov_base);
        for (size_t done = 0; ok && done < iov[i].iov_len; done += slice) {
          iovec part{p + done, std::min(slice, iov[i].iov_len - done)};
          ok = check() && io.tls->write(&part, 1);
        }
        first = i + 1;
      }
      if (ok && first < count)
        ok = (first == 0 || check()) && io.tls->write(iov + first, count - first);
    }
    if (ok)
      return true;
    int err = errno;
    if (err != ECANCELED)
      note_failure(*io.tls);
    errno = err;
    return false;
  }
  if (b != nullptr)
    return write_bounded(io.fd, iov, count, *b);
  return write_all(io.fd, iov, count);
}

namespace {

/// Writes all of `iov` (partial writes continue where they stopped). A peer
/// that went away is an error here (EPIPE), not a SIGPIPE that ends the process.
bool write_all(int fd, iovec* iov, int count) {
  while (count > 0) {
    auto n = send_iov(fd, iov, count, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    skip_sent(iov, count, static_cast<size_t>(n));
  }
  return true;
}

/// read_timed of a plaintext socket.
read_end read_timed(int fd, void* buf, size_t n, int first_wait_ms, int stall_ms,
                    bool poll_first) {
  auto* p = static_cast<char*>(buf);
  bool any = false;
  bool ready = !poll_first;
  while (n > 0) {
    if (ready) {
      auto r = ::recv(fd, p, n, MSG_DONTWAIT);
      if (r > 0) {
        p += r;
        n -= static_cast<size_t>(r);
        any = true;
        continue;
      }
      if (r == 0)
        return read_end::closed;
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return read_end::failed;
    }
    pollfd pfd{fd, POLLIN, 0};
    auto rc = ::poll(&pfd, 1, any ? stall_ms : first_wait_ms);
    if (rc == 0)
      return any || !poll_first ? read_end::stalled : read_end::idle;
    if (rc < 0 && errno != EINTR)
      return read_end::failed;
    ready = true;
  }
  return read_end::done;
}

/// read_timed over the record layer. Bytes it already holds are taken
/// without a poll; otherwise the socket is polled for the first byte as in
/// plaintext, and the record layer's own waits are bounded by the socket's
/// SO_RCVTIMEO (the frame timeout, set when the connection was accepted).
read_end tls_read_timed(const link& io, void* buf, size_t n, int first_wait_ms, bool poll_first) {
  if (poll_first && !io.tls->has_pending()) {
    pollfd pfd{io.fd, POLLIN, 0};
    int rc;
    do
      rc = ::poll(&pfd, 1, first_wait_ms);
    while (rc < 0 && errno == EINTR);
    if (rc == 0)
      return read_end::idle;
    if (rc < 0)
      return read_end::failed;
  }
  size_t got = 0;
  if (io.tls->read(buf, n, &got))
    return read_end::done;
  int err = errno;
  note_failure(*io.tls);
  if (err == ECONNRESET)
    return got == 0 && io.tls->reason().empty() ? read_end::closed : read_end::failed;
  if (err == EAGAIN || err == EWOULDBLOCK)
    return read_end::stalled;
  return read_end::failed;
}

} // namespace

read_end read_timed(const link& io, void* buf, size_t n, int first_wait_ms, int stall_ms,
                    bool poll_first) {
  if (io.ucx != nullptr || io.shm != nullptr) {
    auto b = shm_bound(io);
    b.first_ms = first_wait_ms;
    b.stall_ms = stall_ms;
    switch (io.ucx != nullptr ? io.ucx->read(buf, n, io.fd, b) : io.shm->read(buf, n, io.fd, b)) {
      case shm_channel::status::done:
        return read_end::done;
      case shm_channel::status::closed:
        return read_end::closed;
      case shm_channel::status::idle:
        return poll_first ? read_end::idle : read_end::stalled;
      case shm_channel::status::timeout:
        return read_end::stalled;
      case shm_channel::status::corrupt:
        // Said in the node's log as a record layer's failure is.
        last_tls_error = io.ucx != nullptr
                           ? "it sent bytes on the TCP socket of a connection moved to UCX"
                           : "its shared-memory ring is corrupt (counters out of range, a flood of "
                             "doorbell bytes, or a segment it shrank or punched)";
        return read_end::failed;
      default:
        return read_end::failed;
    }
  }
  if (io.tls != nullptr)
    return tls_read_timed(io, buf, n, first_wait_ms, poll_first);
  return read_timed(io.fd, buf, n, first_wait_ms, stall_ms, poll_first);
}

std::string peer_address(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
              NI_NUMERICHOST | NI_NUMERICSERV);
  return addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port)
                                    : fmt::format("{}:{}", host, port);
}

af_error wire_code(const caf::error& err) {
  if (err.category() == error_category && valid_af_error(err.code()))
    return static_cast<af_error>(err.code());
  return af_error::internal;
}

bool read_all(const link& io, void* buf, size_t n, size_t* got,
              const std::chrono::steady_clock::time_point* until) {
  auto* p = static_cast<char*>(buf);
  if (got != nullptr)
    *got = 0;
  if (io.ucx != nullptr || io.shm != nullptr) {
    auto b = shm_bound(io);
    if (until != nullptr)
      b.deadline = std::min(b.deadline, *until);
    uint64_t moved = 0;
    int err = shm_errno(io.ucx != nullptr ? io.ucx->read(buf, n, io.fd, b, &moved)
                                          : io.shm->read(buf, n, io.fd, b, &moved));
    if (got != nullptr)
      *got = moved;
    errno = err;
    return err == 0;
  }
  if (io.tls != nullptr) {
    if (io.tls->read(buf, n, got))
      return true;
    int err = errno;
    note_failure(*io.tls);
    errno = err;
    return false;
  }
  int fd = io.fd;
  while (n > 0) {
    auto r = ::recv(fd, p, n, MSG_WAITALL);
    if (r == 0) {
      errno = ECONNRESET;
      return false;
    }
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    p += r;
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

bool send_frame(const link& fd, wire::header& h, const std::string* name, const void* payload,
                const send_bound* b) {
  iovec iov[3];
  int count = 0;
  iov[count++] = {&h, sizeof(h)};
  if (name != nullptr && !name->empty())
    iov[count++] = {const_cast<char*>(name->data()), name->size()};
  if (h.payload_bytes > 0)
    iov[count++] = {const_cast<void*>(payload), h.payload_bytes};
  return write_all(fd, iov, count, b);
}

bool send_error(const link& fd, af_error code, const std::string& text) {
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::reply);
  h.status = static_cast<uint8_t>(code);
  h.payload_bytes = text.size();
  return send_frame(fd, h, nullptr, text.data());
}

void last_words(const link& fd, af_error code, const char* node, const char* text) noexcept {
  try {
    send_error(fd, code, std::string{node} + " data plane: " + text);
  } catch (...) {
    // nop: the connection closes without them
  }
}

skipped skip_payload(const link& fd, uint64_t bytes, int frame_ms, read_end& how) {
  if (bytes > drain_limit)
    return skipped::too_large;
  char scratch[65536];
  for (uint64_t left = bytes; left > 0;) {
    auto n = static_cast<size_t>(std::min<uint64_t>(left, sizeof(scratch)));
    how = read_timed(fd, scratch, n, frame_ms, frame_ms, false);
    if (how != read_end::done)
      return skipped::lost;
    left -= n;
  }
  return skipped::past;
}

bool refuse_request(const link& io, af_error code, const std::string& text, uint64_t payload,
                    int frame_ms, read_end& how) {
  how = read_end::done;
  bool drain = payload <= drain_limit;
  if (!send_error(io, code,
                  drain ? text : text + " (the connection is closed: its payload was not read)")
      || !drain)
    return false;
  return skip_payload(io, payload, frame_ms, how) == skipped::past;
}

bool looks_like_frame(const unsigned char* p, size_t n) {
  uint32_t m = wire::magic;
  return n >= 4 && std::memcmp(p, &m, 4) == 0;
}

std::string host_of(const std::string& peer) {
  auto colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

bool looks_like_tls(const unsigned char* p, size_t n) {
  return n >= 2 && (p[0] == 0x16 || p[0] == 0x15) && p[1] == 0x03;
}

void close_refused(int fd) {
  ::shutdown(fd, SHUT_WR);
  char scratch[4096];
  for (int i = 0; i < 16 && ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0; ++i) {
  }
  close(fd);
}

} // namespace af::plane_io
