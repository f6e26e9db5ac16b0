#include "net/byte_channel.hpp"
#include "net/adaptive_spin.hpp"
#include "net/data_link.hpp"
#include "net/socket.hpp"
#include "net/tls_io.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace af {

using namespace plane_io;

namespace {

/// How often a bounded send looks at its cancel flag while the peer reads nothing.
constexpr int cancel_slice_ms = 20;

/// The socket's SO_SNDTIMEO as it was before a bounded TLS write first set
/// it to what is left of its deadline, put back when the write returns, on
/// every path (done, failed, cancelled): the channel's own send wait is the
/// socket's again, so that a later blocking send into a full buffer waits
/// that long, not what was left of an earlier call. Read from the socket
/// (not passed in), so that it is whatever its owner set, to the tick.
class send_wait_kept {
public:
  explicit send_wait_kept(int fd) : fd_(fd) {}
  ~send_wait_kept() {
    if (!saved_)
      return;
    int err = errno;
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &was_, sizeof(was_));
    errno = err;
  }
  send_wait_kept(const send_wait_kept&) = delete;
  send_wait_kept& operator=(const send_wait_kept&) = delete;

  /// Before the first change of the socket's send wait.
  void save() {
    if (saved_)
      return;
    socklen_t len = sizeof(was_);
    saved_ = ::getsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &was_, &len) == 0;
  }

private:
  int fd_;
  bool saved_ = false;
  timeval was_{};
};

/// write_all of a plaintext socket within `b`: non-blocking sends, and a poll
/// for room (at most until the deadline) when the peer's window is full.
bool write_bounded(int fd, iovec* iov, int count, const send_bound& b) {
  while (count > 0) {
    auto n = sock::send_iov(fd, iov, count, MSG_DONTWAIT);
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
    sock::skip_sent(iov, count, static_cast<size_t>(n));
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

/// A plaintext read_timed's wait for bytes: `any` came already (then the
/// stall timeout), else the first wait. done: there are bytes (or an
/// interrupt) to read again; else how the read ended.
read_end wait_readable(int fd, bool any, int first_wait_ms, int stall_ms, bool poll_first) {
  pollfd pfd{fd, POLLIN, 0};
  auto rc = ::poll(&pfd, 1, any ? stall_ms : first_wait_ms);
  if (rc == 0)
    return any || !poll_first ? read_end::stalled : read_end::idle;
  if (rc < 0 && errno != EINTR)
    return read_end::failed;
  return read_end::done;
}

/// After a non-blocking recv that moved nothing (`r` <= 0, errno its):
/// closed, failed, or done (read again) after an interrupt or a wait.
read_end after_empty_recv(int fd, ssize_t r, bool any, int first_wait_ms, int stall_ms,
                          bool poll_first) {
  if (r == 0)
    return read_end::closed;
  if (errno == EINTR)
    return read_end::done;
  if (errno != EAGAIN && errno != EWOULDBLOCK)
    return read_end::failed;
  return wait_readable(fd, any, first_wait_ms, stall_ms, poll_first);
}

/// read_timed of a plaintext socket.
read_end read_timed(int fd, void* buf, size_t n, int first_wait_ms, int stall_ms,
                    bool poll_first) {
  auto* p = static_cast<char*>(buf);
  bool any = false;
  bool ready = !poll_first;
  while (n > 0) {
    ssize_t r = -1;
    if (ready) {
      r = ::recv(fd, p, n, MSG_DONTWAIT);
      if (r > 0) {
        p += r;
        n -= static_cast<size_t>(r);
        any = true;
        continue;
      }
    }
    auto how = ready ? after_empty_recv(fd, r, any, first_wait_ms, stall_ms, poll_first)
                     : wait_readable(fd, any, first_wait_ms, stall_ms, poll_first);
    if (how != read_end::done)
      return how;
    ready = true;
  }
  return read_end::done;
}

/// read_timed over the record layer. Bytes it already holds are taken
/// without a poll; otherwise the socket is polled for the first byte as in
/// plaintext, and the record layer's own waits are bounded by the socket's
/// SO_RCVTIMEO (the frame timeout, set when the connection was accepted).
read_end tls_read_timed(secure_stream& tls, const link& io, void* buf, size_t n, int first_wait_ms,
                        bool poll_first) {
  if (poll_first && !tls.has_pending()) {
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
  if (tls.read(buf, n, &got))
    return read_end::done;
  int err = errno;
  note_failure(tls);
  if (err == ECONNRESET)
    return got == 0 && tls.reason().empty() ? read_end::closed : read_end::failed;
  if (err == EAGAIN || err == EWOULDBLOCK)
    return read_end::stalled;
  return read_end::failed;
}

// -- the plain socket -------------------------------------------------------------

class tcp_channel final : public byte_channel {
public:
  bool write(const data_link& io, iovec* iov, int count, const send_bound* b) override {
    if (b != nullptr)
      return write_bounded(io.fd, iov, count, *b);
    return sock::send_iov_all(io.fd, iov, count);
  }

  read_end read_timed(const data_link& io, void* buf, size_t n, int first_wait_ms, int stall_ms,
                      bool poll_first) override {
    return af::read_timed(io.fd, buf, n, first_wait_ms, stall_ms, poll_first);
  }

  bool read_all(const data_link& io, void* buf, size_t n, size_t* got,
                const std::chrono::steady_clock::time_point* until) override {
    return sock::recv_all(io.fd, buf, n, got, until);
  }

  long read_some(const data_link& io, void* dst, size_t max) override {
    for (;;) {
      auto n = ::recv(io.fd, dst, max, MSG_DONTWAIT);
      if (n > 0)
        return static_cast<long>(n);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
      return -1; // closed (0) or broken
    }
  }

  std::string name() const override { return "tcp"; }

  bool plain_tcp() const override { return true; }
};

/// A served plaintext connection's (net/served_connection.hpp): a read that
/// waits for a new frame sleeps in recv itself (the socket's SO_RCVTIMEO is
/// the idle timeout: no poll before it), and small reads take whatever has
/// come into a buffer of the connection's, so that a small request (its
/// header, name and payload sent together) costs one recv, not a poll and
/// three. A read of the buffer's size or more goes straight to the caller's
/// memory. Within a frame the reads stay non-blocking, a poll bounded by the
/// frame timeout between them, as af::read_timed's.
class tcp_read_ahead_channel final : public byte_channel {
public:
  tcp_read_ahead_channel(int fd, int idle_ms)
    : blocking_wait_((::fcntl(fd, F_GETFL) & O_NONBLOCK) == 0
                     && set_timeout(fd, SO_RCVTIMEO, std::chrono::milliseconds{idle_ms})) {}

  bool write(const data_link& io, iovec* iov, int count, const send_bound* b) override {
    return tcp_bytes().write(io, iov, count, b);
  }

  read_end read_timed(const data_link& io, void* buf, size_t n, int first_wait_ms, int stall_ms,
                      bool poll_first) override {
    auto* p = static_cast<char*>(buf);
    bool any = take(p, n);
    if (n > 0 && poll_first && !any) {
      // A client in a loop of small ops sends its next request moments after
      // our reply: looked for before sleeping (a wake-up costs more).
      ssize_t r = -1;
      int err = 0;
      if (spin_.spin(io.spin, [&] {
            r = ::recv(io.fd, ahead_, sizeof(ahead_), MSG_DONTWAIT);
            err = errno;
            return r >= 0 || (err != EAGAIN && err != EWOULDBLOCK && err != EINTR);
          })) {
        if (r == 0)
          return read_end::closed;
        if (r < 0)
          return read_end::failed;
        begin_ = 0;
        end_ = static_cast<size_t>(r);
        any = take(p, n);
      }
    }
    while (n > 0) {
      // At a frame's start the wait is recv's own (bounded by SO_RCVTIMEO);
      // part way, a non-blocking recv and a poll when nothing is there.
      bool sleep_in_recv = poll_first && !any && blocking_wait_;
      bool direct = n >= sizeof(ahead_);
      auto r = ::recv(io.fd, direct ? p : ahead_, direct ? n : sizeof(ahead_),
                      sleep_in_recv ? 0 : MSG_DONTWAIT);
      if (r > 0) {
        any = true;
        if (direct) {
          p += r;
          n -= static_cast<size_t>(r);
        } else {
          begin_ = 0;
          end_ = static_cast<size_t>(r);
          take(p, n);
        }
        continue;
      }
      if (sleep_in_recv && r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return read_end::idle; // SO_RCVTIMEO passed with nothing
      auto how = after_empty_recv(io.fd, r, any, first_wait_ms, stall_ms, poll_first);
      if (how != read_end::done)
        return how;
    }
    return read_end::done;
  }

  bool read_all(const data_link& io, void* buf, size_t n, size_t* got,
                const std::chrono::steady_clock::time_point* until) override {
    auto* p = static_cast<char*>(buf);
    size_t had = n;
    take(p, n);
    size_t more = 0;
    bool ok = n == 0 || sock::recv_all(io.fd, p, n, &more, until);
    if (got != nullptr)
      *got = had - n + more;
    return ok;
  }

  long read_some(const data_link& io, void* dst, size_t max) override {
    auto* p = static_cast<char*>(dst);
    size_t left = max;
    if (take(p, left))
      return static_cast<long>(max - left);
    return tcp_bytes().read_some(io, dst, max);
  }

  std::string name() const override { return "tcp"; }

  bool has_pending() const override { return end_ > begin_; }

  bool plain_tcp() const override { return true; }

private:
  /// Moves what the buffer holds (up to `n`) to `p`, advancing both; true if any.
  bool take(char*& p, size_t& n) {
    auto k = std::min(n, end_ - begin_);
    if (k == 0)
      return false;
    std::memcpy(p, ahead_ + begin_, k);
    begin_ += k;
    p += k;
    n -= k;
    return true;
  }

  bool blocking_wait_; ///< SO_RCVTIMEO is set: a wait for a frame may sleep in recv
  adaptive_spin spin_; ///< for the next frame
  char ahead_[4096];
  size_t begin_ = 0, end_ = 0;
};

// -- TLS records -------------------------------------------------------------------

class tls_channel final : public byte_channel {
public:
  explicit tls_channel(secure_stream& tls) : tls_(tls) {}

  bool write(const data_link& io, iovec* iov, int count, const send_bound* b) override {
    bool ok = true;
    if (b == nullptr) {
      ok = tls_.write(iov, count);
    } else {
      // The record layer sends blocking, each wait bounded by SO_SNDTIMEO:
      // a large part goes in slices of whole records (so the records are the
      // ones one write would make), the socket's send wait set to what is
      // left of the deadline before each, and the cancel flag looked at;
      // the socket's own send wait again when this returns.
      constexpr size_t slice = 4 * secure_stream::max_record_bytes;
      int first = 0;
      send_wait_kept kept{io.fd};
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
        kept.save();
        set_timeout(io.fd, SO_SNDTIMEO, std::chrono::milliseconds{left});
        return true;
      };
      for (int i = 0; i < count && ok; ++i) {
        if (iov[i].iov_len <= slice)
          continue;
        if (i > first)
          ok = check() && tls_.write(iov + first, i - first);
        auto* p = static_cast<char*>(iov[i].iov_base);
        for (size_t done = 0; ok && done < iov[i].iov_len; done += slice) {
          iovec part{p + done, std::min(slice, iov[i].iov_len - done)};
          ok = check() && tls_.write(&part, 1);
        }
        first = i + 1;
      }
      if (ok && first < count)
        ok = (first == 0 || check()) && tls_.write(iov + first, count - first);
    }
    if (ok)
      return true;
    int err = errno;
    if (err != ECANCELED)
      note_failure(tls_);
    errno = err;
    return false;
  }

  read_end read_timed(const data_link& io, void* buf, size_t n, int first_wait_ms, int,
                      bool poll_first) override {
    return tls_read_timed(tls_, io, buf, n, first_wait_ms, poll_first);
  }

  bool read_all(const data_link&, void* buf, size_t n, size_t* got,
                const std::chrono::steady_clock::time_point*) override {
    if (tls_.read(buf, n, got))
      return true;
    int err = errno;
    note_failure(tls_);
    errno = err;
    return false;
  }

  std::string name() const override { return "tls"; }

  bool has_pending() const override { return tls_.has_pending(); }

private:
  secure_stream& tls_;
};

// -- shared-memory rings and UCX ---------------------------------------------------

/// Over `Ring` (shm_channel or ucx_channel: the same calls, bounded by the
/// link's deadline, stall and cancel flag, with the socket as doorbell).
template <class Ring>
class ring_channel final : public byte_channel {
public:
  /// `corrupt`: what the node's log says of a peer whose ring went bad.
  ring_channel(Ring& ring, const char* corrupt) : ring_(ring), corrupt_(corrupt) {}

  bool write(const data_link& io, iovec* iov, int count, const send_bound* b) override {
    int err = shm_errno(ring_.write(iov, count, io.fd, shm_bound(io, b)));
    errno = err;
    return err == 0;
  }

  read_end read_timed(const data_link& io, void* buf, size_t n, int first_wait_ms, int stall_ms,
                      bool poll_first) override {
    auto b = shm_bound(io);
    b.first_ms = first_wait_ms;
    b.stall_ms = stall_ms;
    switch (ring_.read(buf, n, io.fd, b)) {
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
        last_tls_error = corrupt_;
        return read_end::failed;
      default:
        return read_end::failed;
    }
  }

  bool read_all(const data_link& io, void* buf, size_t n, size_t* got,
                const std::chrono::steady_clock::time_point* until) override {
    auto b = shm_bound(io);
    if (until != nullptr)
      b.deadline = std::min(b.deadline, *until);
    uint64_t moved = 0;
    int err = shm_errno(ring_.read(buf, n, io.fd, b, &moved));
    if (got != nullptr)
      *got = moved;
    errno = err;
    return err == 0;
  }

  std::string name() const override;

  bool waits_itself() const override { return true; }

private:
  Ring& ring_;
  const char* corrupt_;
};

template <>
std::string ring_channel<shm_channel>::name() const {
  return "shared memory";
}

template <>
std::string ring_channel<ucx_channel>::name() const {
  return ring_.transport();
}

} // namespace

byte_channel& tcp_bytes() {
  static tcp_channel tcp;
  return tcp;
}

std::unique_ptr<byte_channel> tcp_read_ahead_bytes(int fd, int idle_ms) {
  return std::make_unique<tcp_read_ahead_channel>(fd, idle_ms);
}

std::unique_ptr<byte_channel> tls_bytes(secure_stream& tls) {
  return std::make_unique<tls_channel>(tls);
}

std::unique_ptr<byte_channel> shm_bytes(shm_channel& shm) {
  return std::make_unique<ring_channel<shm_channel>>(
    shm, "its shared-memory ring is corrupt (counters out of range, a flood of doorbell bytes, or "
         "a segment it shrank or punched)");
}

std::unique_ptr<byte_channel> ucx_bytes(ucx_channel& ucx) {
  return std::make_unique<ring_channel<ucx_channel>>(
    ucx, "it sent bytes on the TCP socket of a connection moved to UCX");
}

} // namespace af
