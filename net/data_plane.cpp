#include "net/data_plane.hpp"
#include "actors/edge_budget.hpp"
#include "net/shm_ring.hpp"
#include "net/tcp_connect.hpp"
#include "net/tls_io.hpp"

#include <limits.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

/// One connection's byte stream: its socket, and its record layer
/// (net/tls_io.hpp) when the data plane runs with [security], or its
/// shared-memory rings (net/shm_ring.hpp) once a client on this host has
/// moved to them. The plaintext path is the socket calls it always was: one
/// test of `tls` and `shm` per call, none per byte.
struct data_link {
  int fd = -1;
  secure_stream* tls = nullptr;
  shm_channel* shm = nullptr;
  ucx_channel* ucx = nullptr; ///< net/ucx_link.hpp, bounded as shm is
  // On shared memory (and UCX), what bounds a wait (the socket's timeouts do on TCP):
  int stall_ms = 0; ///< no byte moved for this long (the node's frame timeout)
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  const std::atomic<bool>* cancel = nullptr;
  std::chrono::microseconds spin{0}; ///< spin before sleeping in poll
};

namespace {

using link = data_link;

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// Why the record layer failed last on this thread (errno is then EPROTO,
/// or ECONNRESET for a record cut short): the reason for the error message
/// or the log line.
thread_local std::string last_tls_error;

/// After a failed read or write of `tls`: its reason kept for the message.
void note_failure(const secure_stream& tls) {
  if (!tls.reason().empty())
    last_tls_error = tls.reason();
}

bool write_all(int fd, iovec* iov, int count);

void set_timeout(int fd, int option, std::chrono::milliseconds t);

/// A client call's bound on its sends: one deadline for the whole frame (not
/// a wait per send that each byte moved restarts), and a cancel flag (Ctrl-C)
/// looked at between slices. Past the deadline: EAGAIN; cancelled: ECANCELED.
struct send_bound {
  std::chrono::steady_clock::time_point deadline;
  const std::atomic<bool>* cancel = nullptr;
};

/// How often a bounded send looks at its cancel flag while the peer reads nothing.
constexpr int cancel_slice_ms = 20;

/// Milliseconds left before `b`'s deadline (0 if none).
long long ms_left(const send_bound& b) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                b.deadline - std::chrono::steady_clock::now())
                .count();
  return std::max<long long>(left, 0);
}

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

bool write_all(const link& io, iovec* iov, int count, const send_bound* b = nullptr) {
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

/// How a server-side read ended.
enum class read_end { done, closed, idle, stalled, failed };

/// Reads exactly `n` bytes on a server connection without ever blocking for
/// longer than a timeout: up to `first_wait_ms` for the first byte, then up to
/// `stall_ms` for each next one. idle: nothing came at all; stalled: the peer
/// stopped part way. At a frame's start the socket is polled first: a client
/// between ops usually has sent nothing yet.
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

/// "host:port" ("[v6]:port") of a connected peer.
std::string peer_address(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
              NI_NUMERICHOST | NI_NUMERICSERV);
  return addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port)
                                    : fmt::format("{}:{}", host, port);
}

/// The af_error to put on the wire for `err`: its own code, or for an error
/// that is not actorflow's (CAF's, say) internal, with its text.
af_error wire_code(const caf::error& err) {
  if (err.category() == error_category && valid_af_error(err.code()))
    return static_cast<af_error>(err.code());
  return af_error::internal;
}

/// Reads exactly `n` bytes (client side: the socket's SO_RCVTIMEO bounds each
/// wait); false on EOF, error or timeout (errno tells). `got`: how many came.
/// `until` (plaintext): a read that stopped part way is not begun again past
/// it (EAGAIN), so a node that stalls mid-reply costs at most one more wait.
bool read_all(const link& io, void* buf, size_t n, size_t* got = nullptr,
              const std::chrono::steady_clock::time_point* until = nullptr) {
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
                const send_bound* b = nullptr) {
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

/// send_error for a connection that is closing anyway: nothing may throw.
void last_words(const link& fd, af_error code, const char* node, const char* text) noexcept {
  try {
    send_error(fd, code, std::string{node} + " data plane: " + text);
  } catch (...) {
    // nop: the connection closes without them
  }
}

void set_timeout(int fd, int option, std::chrono::milliseconds t) {
  timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
}

/// The most payload a refused request is read past so that its connection
/// stays usable. A refusal of a larger one goes out at once and the
/// connection closes: a peer that declares terabytes (and sends nothing)
/// gets its answer now instead of holding a thread until the frame timeout
/// and getting none.
constexpr uint64_t drain_limit = uint64_t{1} << 30;

/// What became of a refused request's payload: skipped (the connection goes
/// on), too large to skip (answered, to be closed), or lost (the peer
/// stalled or left; `how` says which).
enum class skipped { past, too_large, lost };

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

/// Refuses a request before its payload is read (a peer that declares an
/// operand and never sends it still hears why), then skips the payload
/// through a small buffer, under the frame timeout, so that the connection
/// goes on; one too large to skip is answered and closed. True: the
/// connection goes on; else `how` says whether the peer stalled or left.
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

/// Runs SSL_accept (server) or SSL_connect on `fd` until it is done or
/// `limit` has passed, the socket non-blocking meanwhile: a peer that
/// trickles its handshake cannot stretch it. Empty on success, else why not.
std::string handshake(SSL* ssl, int fd, bool server, std::chrono::milliseconds limit) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  auto deadline = std::chrono::steady_clock::now() + limit;
  std::string why;
  for (;;) {
    ERR_clear_error();
    errno = 0;
    int ret = server ? SSL_accept(ssl) : SSL_connect(ssl);
    if (ret == 1)
      break;
    int err = SSL_get_error(ssl, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
      if (left <= 0) {
        why = fmt::format("the TLS handshake did not finish within {} ms", limit.count());
        break;
      }
      pollfd pfd{fd, static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
      ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
      continue;
    }
    why = tls_handshake_failure(ssl, ret);
    break;
  }
  fcntl(fd, F_SETFL, flags);
  return why;
}

/// The first bytes of a frame header ("AFDP" in host byte order).
bool looks_like_frame(const unsigned char* p, size_t n) {
  uint32_t m = wire::magic;
  return n >= 4 && std::memcmp(p, &m, 4) == 0;
}

/// Connections of one host that may be in their TLS handshake at once.
constexpr int max_handshakes_per_host = 8;

/// "h" of "h:port" or "[v6]:port".
std::string host_of(const std::string& peer) {
  auto colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

/// The first bytes of a TLS record (handshake or alert, version 3.x).
bool looks_like_tls(const unsigned char* p, size_t n) {
  return n >= 2 && (p[0] == 0x16 || p[0] == 0x15) && p[1] == 0x03;
}

/// Closes a connection refused before it was served: what it sent is read
/// (a little, without waiting) so that the close is a FIN, not a reset that
/// would take a reply already sent with it.
void close_refused(int fd) {
  ::shutdown(fd, SHUT_WR);
  char scratch[4096];
  for (int i = 0; i < 16 && ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0; ++i) {
  }
  close(fd);
}

} // namespace

// -- variable_directory --------------------------------------------------------

void variable_directory::put(const std::string& name, entry e) {
  std::lock_guard<std::mutex> guard{mtx_};
  vars_[name] = std::move(e);
}

variable_directory::entry variable_directory::get(const std::string& name) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = vars_.find(name);
  return it == vars_.end() ? entry{} : it->second;
}

void variable_directory::remove(const std::string& name, const caf::actor_addr& actor) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = vars_.find(name);
  if (it != vars_.end() && it->second.actor.address() == actor)
    vars_.erase(it);
}

void variable_directory::remove(const std::string& name) {
  std::lock_guard<std::mutex> guard{mtx_};
  vars_.erase(name);
}

void variable_directory::put_aggregator(const std::string& name, aggregator_entry e) {
  std::lock_guard<std::mutex> guard{mtx_};
  aggs_[name] = std::move(e);
}

variable_directory::aggregator_entry variable_directory::get_aggregator(const std::string& name) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = aggs_.find(name);
  return it == aggs_.end() ? aggregator_entry{} : it->second;
}

void variable_directory::remove_aggregator(const std::string& name) {
  std::lock_guard<std::mutex> guard{mtx_};
  aggs_.erase(name);
}

void variable_directory::set_aggregator_call(aggregator_call f) {
  std::lock_guard<std::mutex> guard{mtx_};
  call_ = std::move(f);
}

variable_directory::aggregator_call variable_directory::aggregator_caller() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return call_;
}

void variable_directory::put_executor(const std::string& device, executor_actor e) {
  std::lock_guard<std::mutex> guard{mtx_};
  execs_[device] = std::move(e);
}

executor_actor variable_directory::get_executor(const std::string& device) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = execs_.find(device);
  return it == execs_.end() ? executor_actor{} : it->second;
}

void variable_directory::remove_executor(const std::string& device) {
  std::lock_guard<std::mutex> guard{mtx_};
  execs_.erase(device);
}

// -- data_plane_server ---------------------------------------------------------

caf::expected<std::unique_ptr<data_plane_server>>
data_plane_server::start(std::shared_ptr<variable_directory> dir, const std::string& bind_host,
                         uint16_t port, std::string node_name, data_plane_limits timeouts,
                         std::shared_ptr<tls_context> tls) {
  if (timeouts.idle.count() <= 0 || timeouts.frame.count() <= 0
      || timeouts.idle.count() > std::numeric_limits<int>::max()
      || timeouts.frame.count() > std::numeric_limits<int>::max())
    return make_error(af_error::invalid_config,
                      fmt::format("{}: data-plane timeouts must be 1 ms .. 24 days (idle {} ms, "
                                  "frame {} ms)",
                                  node_name, timeouts.idle.count(), timeouts.frame.count()));
  if (timeouts.max_message_bytes <= 0 || timeouts.max_variable_bytes <= 0
      || timeouts.max_connections <= 0)
    return make_error(af_error::invalid_config,
                      fmt::format("{}: [node] max_message_bytes ({}), max_variable_bytes ({}) and "
                                  "max_data_connections ({}) must be positive",
                                  node_name, timeouts.max_message_bytes, timeouts.max_variable_bytes,
                                  timeouts.max_connections));
  std::unique_ptr<data_plane_server> srv{
    new data_plane_server(std::move(dir), node_name, timeouts, std::move(tls))};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  auto rc = getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(), std::to_string(port).c_str(),
                        &hints, &res);
  if (rc != 0)
    return make_error(af_error::bind_failed, node_name + ": cannot resolve '" + bind_host
                                               + "' for the data plane: " + gai_strerror(rc));
  std::string why;
  for (auto* ai = res; ai != nullptr && srv->listen_fd_ < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
      continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
      srv->port_ = ntohs(addr.ss_family == AF_INET6
                           ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
      srv->listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(res);
  if (srv->listen_fd_ < 0)
    return make_error(af_error::bind_failed,
                      node_name + ": the data plane cannot listen on " + (bind_host.empty() ? "*" : bind_host)
                        + ":" + std::to_string(port) + " (" + why
                        + "); is another process using the port? Pick another data_port in [node]");
  srv->acceptor_ = std::thread{[s = srv.get()] { s->accept_loop(); }};
  return srv;
}

data_plane_server::~data_plane_server() {
  stop();
}

void data_plane_server::stop() {
  if (stopping_.exchange(true))
    return;
  // shutdown() wakes the threads blocked in accept/recv on these sockets.
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable())
    acceptor_.join();
  close(listen_fd_);
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (int fd : conns_)
      ::shutdown(fd, SHUT_RDWR);
    workers.swap(workers_);
  }
  for (auto& t : workers)
    t.join();
}

void data_plane_server::accept_loop() {
  // A spare descriptor: out of descriptors, it is given up for a moment to
  // accept the pending connection and close it at once (its peer hears
  // "closed" instead of waiting in the backlog), then taken again.
  int spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int backoff_ms = 10;
  bool exhausted = false;  // in a burst of accept failures (logged once)
  uint64_t shed = 0;       // connections closed unserved in that burst
  uint64_t over_limit = 0; // connections refused over max_connections, since the last log
  uint64_t over_handshakes = 0; // ... over max_handshakes_per_host
  while (!stopping_) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED)
        continue;
      if (stopping_)
        break; // stop() shut the socket down
      if (!exhausted) {
        log::get()->warn("{} data plane: cannot accept connections ({}){}; new ones are closed "
                         "unserved until it can again",
                         node_name_, std::strerror(err),
                         err == EMFILE || err == ENFILE
                           ? " -- out of file descriptors: raise the limit (ulimit -n, systemd "
                             "LimitNOFILE) or lower [node] max_data_connections"
                           : "");
        exhausted = true;
      }
      // (Linux fails accept with EMFILE whether or not a connection waits:
      // shed one only if it is there, never block here without the spare.)
      pollfd pending{listen_fd_, POLLIN, 0};
      if ((err == EMFILE || err == ENFILE) && spare >= 0 && ::poll(&pending, 1, 0) > 0) {
        close(spare);
        int victim = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (victim >= 0) {
          close(victim);
          ++shed;
        }
        spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      } else if (spare < 0) {
        spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      }
      pollfd pfd{listen_fd_, 0, 0};
      ::poll(&pfd, 1, backoff_ms); // wakes early if stop() shuts the socket down
      backoff_ms = std::min(backoff_ms * 2, 100);
      continue;
    }
    if (exhausted) {
      log::get()->info("{} data plane: accepting connections again ({} closed unserved meanwhile)",
                       node_name_, shed);
      exhausted = false;
      shed = 0;
      backoff_ms = 10;
    }
    tune_socket(fd);
    // A reader that stops taking our reply must not hold this thread either.
    set_timeout(fd, SO_SNDTIMEO, timeouts_.frame);
    // Over TLS, the record layer's waits inside a frame are bounded by the socket.
    if (tls_)
      set_timeout(fd, SO_RCVTIMEO, timeouts_.frame);
    std::vector<std::thread> done;
    try {
      auto peer = peer_address(addr, len);
      std::unique_lock<std::mutex> guard{mtx_};
      if (stopping_) {
        close(fd);
        break;
      }
      // Join the threads of connections that closed since: a long-lived
      // node with many short-lived clients must not keep their stacks.
      for (auto it = workers_.begin(); it != workers_.end();)
        if (std::find(finished_.begin(), finished_.end(), it->get_id()) != finished_.end()) {
          done.push_back(std::move(*it));
          it = workers_.erase(it);
        } else {
          ++it;
        }
      finished_.clear();
      if (conns_.size() >= static_cast<size_t>(timeouts_.max_connections)) {
        // One more than the limit: closed at once. Logged once per burst (a
        // client retrying in a loop must not flood the log), counted after.
        auto open_now = conns_.size();
        guard.unlock();
        if (over_limit++ == 0)
          log::get()->warn("{} data plane: refused {}: {} connections are open, the most it serves "
                           "([node] max_data_connections = {}); further refusals are counted",
                           node_name_, peer, open_now, timeouts_.max_connections);
        if (!tls_)
          last_words(link{fd, nullptr}, af_error::resource_exhausted, node_name_.c_str(),
                     fmt::format("{} connections are open, the most this node serves ([node] "
                                 "max_data_connections = {}); try again when one has closed",
                                 open_now, timeouts_.max_connections)
                       .c_str());
        close_refused(fd);
        for (auto& t : done)
          t.join();
        continue;
      }
      if (tls_) {
        // A stranger's connection holds a slot (and a thread) until its
        // handshake fails, up to one frame timeout: a few per host at once.
        auto& pending = handshaking_[host_of(peer)];
        if (pending >= max_handshakes_per_host) {
          guard.unlock();
          if (over_handshakes++ == 0)
            log::get()->warn("{} data plane: refused {}: {} connections from its host are still in "
                             "their TLS handshake; further refusals are counted",
                             node_name_, peer, pending);
          close_refused(fd);
          for (auto& t : done)
            t.join();
          continue;
        }
        ++pending;
        if (over_handshakes > 1)
          log::get()->warn("{} data plane: refused {} more connections of hosts with {} handshakes "
                           "in progress",
                           node_name_, over_handshakes - 1, max_handshakes_per_host);
        over_handshakes = 0;
      }
      if (over_limit > 1)
        log::get()->warn("{} data plane: refused {} more connections over [node] "
                         "max_data_connections = {}",
                         node_name_, over_limit - 1, timeouts_.max_connections);
      over_limit = 0;
      conns_.push_back(fd);
      try {
        workers_.emplace_back([this, fd, peer] { serve(fd, peer); });
      } catch (...) {
        conns_.pop_back();
        if (tls_) {
          auto it = handshaking_.find(host_of(peer));
          if (it != handshaking_.end() && --it->second <= 0)
            handshaking_.erase(it);
        }
        throw;
      }
    } catch (const std::exception& e) {
      // No memory or no thread for one more connection (std::system_error,
      // std::bad_alloc): refuse this one, keep serving the others.
      log::get()->warn("{} data plane: refused a connection: {}", node_name_, e.what());
      close(fd);
    }
    for (auto& t : done)
      t.join();
  }
  if (spare >= 0)
    close(spare);
}

bool data_plane_server::serve_aggregator(const data_link& io, const std::string& peer,
                                         const wire::header& h, const std::string& frame_name) {
  auto frame_ms = static_cast<int>(timeouts_.frame.count());
  bool push = h.kind == static_cast<uint8_t>(wire::kind::push)
              || h.kind == static_cast<uint8_t>(wire::kind::push_params);
  // A push's name starts with who it speaks for (wire::push_prefix): the
  // aggregator checks the token, and names this peer if it is refused.
  push_credentials who;
  who.from = "data-plane peer " + peer;
  std::string name = frame_name;
  bool short_prefix = push && frame_name.size() < sizeof(wire::push_prefix);
  if (push && !short_prefix) {
    wire::push_prefix pre;
    std::memcpy(&pre, frame_name.data(), sizeof(pre));
    who.token.assign(reinterpret_cast<const char*>(pre.token), sizeof(pre.token));
    who.seq = pre.seq;
    name = frame_name.substr(sizeof(pre));
  }
  auto agg = dir_->get_aggregator(name);
  auto caller = dir_->aggregator_caller();
  // Checked before anything is allocated: a push for an aggregator that does
  // not exist, or of another size, cannot make the node take its memory.
  std::string refusal;
  af_error code = af_error::invalid_argument;
  if (short_prefix) {
    refusal = fmt::format("a push frame whose name of {} bytes is shorter than its {}-byte prefix "
                          "(the worker's token and push number); is the sender of another "
                          "actorflow version?",
                          frame_name.size(), sizeof(wire::push_prefix));
  } else if (!agg.actor || !caller) {
    code = af_error::not_found;
    refusal = fmt::format("no aggregator '{}' on {}; the chief creates it when the job starts",
                          name, node_name_);
  } else if (h.payload_bytes > static_cast<uint64_t>(timeouts_.max_message_bytes)) {
    code = af_error::resource_exhausted;
    refusal = fmt::format("{} to aggregator '{}': a payload of {} bytes is over {}'s limit of {} "
                          "bytes per message ([node] max_message_bytes)",
                          push ? "push" : "pull", name, h.payload_bytes, node_name_,
                          timeouts_.max_message_bytes);
  } else if (h.has_tensor && !push) {
    // A pull carries no values: saying "float32[650] values, expected
    // float32[650]" of one that did named the wrong fault.
    refusal = fmt::format("pull from aggregator '{}' carries {}{} values: a pull sends none (a "
                          "push sends values)",
                          name, dtype_name(static_cast<dtype>(h.dtype)),
                          shape_string(wire::shape_of(h)));
  } else if (h.has_tensor
             && (static_cast<dtype>(h.dtype) != dtype::float32 || h.rank != 1
                 || static_cast<uint64_t>(h.dims[0]) != agg.floats)) {
    code = af_error::shape_mismatch;
    refusal = fmt::format("push to aggregator '{}': {}{} values, expected float32[{}]",
                          name, dtype_name(static_cast<dtype>(h.dtype)),
                          shape_string(wire::shape_of(h)), agg.floats);
  } else if (!h.has_tensor && h.payload_bytes > 0) {
    refusal = "a push or pull with a payload that is no tensor";
  }
  read_end how = read_end::done;
  if (!refusal.empty())
    return refuse_request(io, code, refusal, h.payload_bytes, frame_ms, how);
  tensor values;
  if (h.has_tensor) {
    try {
      values.reset(dtype::float32, wire::shape_of(h));
    } catch (const std::bad_alloc&) {
      return refuse_request(io, af_error::resource_exhausted,
                            fmt::format("{} cannot allocate {} bytes for a push to '{}' (out of "
                                        "memory)",
                                        node_name_, h.payload_bytes, name),
                            h.payload_bytes, frame_ms, how);
    }
    if (h.payload_bytes > 0
        && read_timed(io, values.mutable_bytes(), h.payload_bytes, frame_ms, frame_ms, false)
             != read_end::done) {
      log::get()->warn("{} data plane: dropped {}: it stopped in the middle of a push to '{}'",
                       node_name_, peer, name);
      return false;
    }
  }
  auto r = caller(agg.actor, h.kind, h.reserved, h.version, std::move(who), std::move(values),
                  agg.wait);
  if (!r)
    return send_error(io, wire_code(r.error()), describe(r.error()));
  wire::header reply;
  reply.kind = static_cast<uint8_t>(wire::kind::reply);
  reply.version = r->first;
  const auto& params = r->second;
  if (!params.empty())
    wire::describe_tensor(params, reply); // rank 1
  return send_frame(io, reply, nullptr, params.empty() ? nullptr : params.bytes());
}

bool data_plane_server::serve_edge(const data_link& io, const std::string& peer,
                                   const wire::header& h, const std::string& name) {
  auto frame_ms = static_cast<int>(timeouts_.frame.count());
  // Checked before anything is allocated: a value for an executor this node
  // does not have, or over the limit, cannot make the node take its memory.
  std::string refusal;
  af_error code = af_error::invalid_argument;
  wire::edge_prefix pre;
  std::string device;
  executor_actor exec;
  if (name.size() < sizeof(pre)) {
    refusal = fmt::format("an edge frame whose name of {} bytes is shorter than its {}-byte prefix "
                          "(graph, sent time, op, token); is the sender of another actorflow "
                          "version?",
                          name.size(), sizeof(pre));
  } else {
    std::memcpy(&pre, name.data(), sizeof(pre));
    device = name.substr(sizeof(pre));
    exec = dir_->get_executor(device);
    if (!exec) {
      code = af_error::not_found;
      refusal = fmt::format("no executor '{}' on {}; a value for it was sent to the wrong node, or "
                            "the node restarted",
                            device, node_name_);
    } else if (h.payload_bytes > static_cast<uint64_t>(timeouts_.max_message_bytes)) {
      code = af_error::resource_exhausted;
      refusal = fmt::format("the value of op {} for '{}': a payload of {} bytes is over {}'s limit "
                            "of {} bytes per message ([node] max_message_bytes)",
                            pre.op, device, h.payload_bytes, node_name_,
                            timeouts_.max_message_bytes);
    } else if (!h.has_tensor) {
      refusal = fmt::format("the value of op {} for '{}': an edge frame without a tensor "
                            "(has_tensor = 0); an edge carries the producer's tensor",
                            pre.op, device);
    }
  }
  // Refusals are logged per connection: the first, then a count every 10 s
  // (one connection serves on one thread).
  thread_local std::string log_peer;
  thread_local refusal_log refusals;
  auto log_refusal = [&](const std::string& why) {
    if (log_peer != peer) {
      log_peer = peer;
      refusals = refusal_log{};
    }
    uint64_t skipped = 0;
    if (refusals.due(skipped))
      log::get()->warn("{} data plane: refused an edge from {}: {}{}", node_name_, peer, why,
                       skipped == 0 ? std::string{}
                                    : fmt::format(" (and {} other edge(s) of it since the last "
                                                  "such line)",
                                                  skipped));
  };
  read_end how = read_end::done;
  if (!refusal.empty()) {
    log_refusal(refusal);
    return refuse_request(io, code, refusal, h.payload_bytes, frame_ms, how);
  }
  // The executor's edge bytes not yet taken by a running step (values it
  // has not handled, values of steps whose run_step has not come) stay
  // within 2 x max_message_bytes: over it the edge waits up to a frame's
  // timeout for room (back-pressure on a busy executor), then is refused
  // before anything is allocated. The executor gives the bytes back.
  auto held = edge_bytes_of(caf::actor_cast<caf::actor_addr>(exec), false);
  auto need = static_cast<int64_t>(h.payload_bytes);
  if (held) {
    auto budget = 2 * timeouts_.max_message_bytes;
    auto until = std::chrono::steady_clock::now() + timeouts_.frame;
    auto pause = std::chrono::milliseconds{1};
    while (!reserve_edge_bytes(*held, need, budget)) {
      if (std::chrono::steady_clock::now() >= until) {
        refusal = fmt::format("the value of op {} for '{}': {} holds {} bytes of values for it "
                              "that no running step has taken, and {} more would pass its budget "
                              "of {} bytes (2 x [node] max_message_bytes); the executor is busy, "
                              "or a sender is ahead of its steps",
                              pre.op, device, node_name_, held->load(), need, budget);
        log_refusal(refusal);
        return refuse_request(io, af_error::resource_exhausted, refusal, h.payload_bytes,
                              frame_ms, how);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds{20});
    }
  }
  auto give_back = [&] {
    if (held)
      release_edge_bytes(*held, need);
  };
  tensor value;
  if (h.has_tensor) {
    try {
      value.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
    } catch (const std::bad_alloc&) {
      give_back();
      return refuse_request(io, af_error::resource_exhausted,
                            fmt::format("{} cannot allocate {} bytes for the value of op {} for "
                                        "'{}' (out of memory)",
                                        node_name_, h.payload_bytes, pre.op, device),
                            h.payload_bytes, frame_ms, how);
    }
    if (h.payload_bytes > 0
        && read_timed(io, value.mutable_bytes(), h.payload_bytes, frame_ms, frame_ms, false)
             != read_end::done) {
      give_back();
      log::get()->warn("{} data plane: dropped {}: it stopped in the middle of the value of op {} "
                       "for '{}'",
                       node_name_, peer, pre.op, device);
      return false;
    }
  }
  // The receiving executor learns the way the value came, for the trace.
  // (UCX first: after its offer the frames go over it, the TLS stream kept only for liveness.)
  std::string path = "data plane ("
                     + (io.ucx != nullptr ? io.ucx->transport()
                        : io.shm != nullptr ? std::string{"shared memory"}
                        : io.tls != nullptr ? std::string{"tls"}
                                            : std::string{"tcp"})
                     + ") from " + peer;
  // A local message: the executor shares the buffer just read, no copy.
  // The executor checks the graph's token (in constant time) before it
  // takes the value, and logs a wrong one with `path`; the ack below is the
  // same either way, so a sender learns nothing of the token from it.
  caf::anon_send(exec, edge_atom::value, pre.graph, h.version, pre.op, std::move(value),
                 pre.sent_ns, std::move(path),
                 std::string(reinterpret_cast<const char*>(pre.token), sizeof(pre.token)));
  wire::header reply;
  reply.kind = static_cast<uint8_t>(wire::kind::reply);
  return send_frame(io, reply, nullptr, nullptr);
}

std::unique_ptr<secure_stream> data_plane_server::accept_tls(int fd, const std::string& peer) {
  auto frame_ms = static_cast<int>(timeouts_.frame.count());
  auto start = std::chrono::steady_clock::now();
  // A plaintext client of ours starts with a frame's magic: it gets a
  // plaintext answer that says why, not a TLS alert it cannot read.
  unsigned char first[4] = {};
  pollfd pfd{fd, POLLIN, 0};
  ssize_t seen = 0;
  if (::poll(&pfd, 1, frame_ms) > 0)
    seen = ::recv(fd, first, sizeof(first), MSG_PEEK | MSG_DONTWAIT);
  if (seen == sizeof(first) && looks_like_frame(first, sizeof(first))) {
    log::get()->warn("{} data plane: refused {}: a plaintext data-plane client (this node's data "
                     "plane is TLS: [security] in the cluster config)",
                     node_name_, peer);
    last_words(link{fd, nullptr}, af_error::invalid_config, node_name_.c_str(),
               "this data plane is TLS only; a plaintext client was refused (set [security] with "
               "the cluster's CA, certificate and key in this process's cluster config)");
    return nullptr;
  }
  SSL* ssl = SSL_new(tls_->native());
  if (ssl == nullptr || !tls_set_socket_read_ahead(ssl, fd)) {
    log::get()->warn("{} data plane: refused {}: {}", node_name_, peer,
                     tls_errors("no TLS session (out of memory?)"));
    SSL_free(ssl);
    return nullptr;
  }
  // The wait for the first bytes counts: the whole handshake is bounded by
  // one frame timeout.
  auto left = timeouts_.frame - std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - start);
  auto why = handshake(ssl, fd, true, std::max(left, std::chrono::milliseconds{1}));
  if (why.rfind("the TLS handshake did not finish", 0) == 0) // say the whole limit, not what was left
    why = fmt::format("the TLS handshake did not finish within {} ms ([node] data_frame_timeout_ms)",
                      timeouts_.frame.count());
  if (!why.empty()) {
    log::get()->warn("{} data plane: refused {}: {}", node_name_, peer, why);
    SSL_free(ssl);
    return nullptr;
  }
  // From here on the record layer of tls_io.hpp: its first record tells the
  // client that its certificate was taken (a refusal is the TLS alert instead).
  auto stream = secure_stream::make(ssl, fd, true, why);
  if (!stream) {
    log::get()->warn("{} data plane: refused {}: {}", node_name_, peer, why);
    SSL_free(ssl);
    return nullptr;
  }
  if (!stream->send_hello()) {
    log::get()->warn("{} data plane: dropped {} right after its TLS handshake: {}", node_name_, peer,
                     stream->reason().empty() ? std::strerror(errno) : stream->reason());
    return nullptr;
  }
  return stream;
}

void data_plane_server::serve(int fd, const std::string& peer) {
  std::unique_ptr<secure_stream> stream;
  if (tls_) {
    stream = accept_tls(fd, peer);
    std::lock_guard<std::mutex> guard{mtx_};
    auto it = handshaking_.find(host_of(peer));
    if (it != handshaking_.end() && --it->second <= 0)
      handshaking_.erase(it);
  }
  if (tls_ && !stream) {
    std::lock_guard<std::mutex> guard{mtx_};
    conns_.erase(std::remove(conns_.begin(), conns_.end(), fd), conns_.end());
    close_refused(fd);
    try {
      finished_.push_back(std::this_thread::get_id());
    } catch (const std::bad_alloc&) {
      // nop: stop() joins this thread instead
    }
    return;
  }
  link io{fd, stream.get()};
  auto idle_ms = static_cast<int>(timeouts_.idle.count());
  auto frame_ms = static_cast<int>(timeouts_.frame.count());
  // On shared memory (after the client's offer): the rings, bounded as the
  // socket's reads and sends are.
  // Its share of max_shm_bytes, given back when the connection ends (after
  // the segment is unmapped: declared first, destroyed last).
  int64_t shm_bytes = 0;
  struct give_back {
    std::atomic<int64_t>& total;
    int64_t& bytes;
    ~give_back() { total.fetch_sub(bytes); }
  } shm_share{shm_mapped_, shm_bytes};
  std::unique_ptr<shm_channel> shm;
  std::unique_ptr<ucx_channel> ucx; // after a client's offer of UCX (net/ucx_link.hpp)
  int ucx_refused = 0;              // offers refused as not an address: the second closes
  io.stall_ms = frame_ms;
  io.spin = timeouts_.shm_spin;
  // True if a read ended the connection; says why in the log if the peer went silent.
  auto ended = [&](read_end how, const char* where) -> bool {
    if (how == read_end::idle)
      log::get()->info("{} data plane: closed the connection of {}: idle for {} ms", node_name_,
                       peer, idle_ms);
    else if (how == read_end::stalled)
      log::get()->warn("{} data plane: dropped {}: it stopped sending in the middle of a frame's {} "
                       "for {} ms",
                       node_name_, peer, where, frame_ms);
    else if (how == read_end::failed && !last_tls_error.empty())
      log::get()->warn("{} data plane: closed the connection of {} (reading a frame's {}): {}",
                       node_name_, peer, where, std::exchange(last_tls_error, {}));
    return how != read_end::done;
  };
  try {
    std::string name;
    wire::header h;
    for (;;) {
      if (ended(read_timed(io, &h, sizeof(h), idle_ms, frame_ms, true), "header"))
        break;
      auto problem = wire::validate(h);
      bool offer = h.kind == static_cast<uint8_t>(wire::kind::shm_offer);
      bool edge = h.kind == static_cast<uint8_t>(wire::kind::edge);
      bool ucx_offer = h.kind == static_cast<uint8_t>(wire::kind::ucx_offer);
      if (problem.empty() && !valid_var_op(h.kind) && !wire::aggregator_kind(h.kind) && !offer
          && !edge && !ucx_offer)
        problem = "a reply frame sent as a request";
      if (ucx_offer && (h.payload_bytes > ucx_channel::max_address_bytes || h.has_tensor
                        || h.name_len != 0))
        problem = fmt::format("an offer of UCX with a worker address of {} bytes (at most {}), a "
                              "tensor or a name: not one of actorflow's",
                              h.payload_bytes, ucx_channel::max_address_bytes);
      if (problem.empty() && offer && (h.payload_bytes != 0 || h.has_tensor))
        problem = "an offer of shared memory with a payload";
      if (!problem.empty() && looks_like_tls(reinterpret_cast<const unsigned char*>(&h), 2))
        problem = "a TLS client, but this data plane is plaintext (no [security] in this node's "
                  "cluster config)";
      if (!problem.empty()) {
        // The stream cannot be trusted past a bad header: answer and hang up.
        log::get()->warn("{} data plane: refused {}: {}", node_name_, peer, problem);
        send_error(io, af_error::invalid_argument, node_name_ + " data plane: " + problem);
        break;
      }
      name.resize(h.name_len);
      if (h.name_len > 0 && ended(read_timed(io, name.data(), name.size(), frame_ms, frame_ms, false),
                                  "variable name"))
        break;
      if (ucx_offer) {
        // A client on another host of a trusted fabric offers UCX: taken if
        // this node trusts the fabric too and has UCX; declined (the client
        // stays on TCP/TLS) otherwise, or if its address is not one UCX can
        // reach (logged: garbage here is a client's bug or a stranger).
        std::string theirs(h.payload_bytes, '\0');
        if (!theirs.empty()
            && ended(read_timed(io, theirs.data(), theirs.size(), frame_ms, frame_ms, false),
                     "payload"))
          break;
        const char* stays = io.tls != nullptr ? "TLS" : "TCP";
        std::unique_ptr<ucx_channel> ch;
        if (io.shm || io.ucx) {
          log::get()->warn("{} data plane: {} offered UCX a second time; declined", node_name_, peer);
        } else if (!timeouts_.trusted_fabric) {
          log::get()->info("{} data plane: {} stays on {}: it offered UCX, but this node does not "
                           "trust the fabric (set [security] trusted_fabric = true on both ends "
                           "to allow unencrypted UCX)",
                           node_name_, peer, stays);
        } else if (auto bad = ucx_channel::check_offer(theirs); !bad.empty()) {
          // Checked before a worker is made (~14 ms of CPU each): a client
          // that sends garbage gets one refusal, then the connection closes.
          log::get()->warn("{} data plane: {} stays on {}: refused its offer of UCX: {}", node_name_,
                           peer, stays, bad);
          if (++ucx_refused > 1)
            break;
        } else if (auto made = ucx_channel::create(); !made) {
          log::get()->info("{} data plane: {} stays on {}: {}", node_name_, peer, stays,
                           describe(made.error()));
        } else if (auto err = (*made)->connect(theirs)) {
          log::get()->warn("{} data plane: {} stays on {}: refused its offer of UCX: {}", node_name_,
                           peer, stays, describe(err));
        } else {
          ch = std::move(*made);
        }
        wire::header reply;
        reply.kind = static_cast<uint8_t>(wire::kind::reply);
        reply.version = ch ? 1 : 0;
        reply.payload_bytes = ch ? ch->address().size() : 0;
        if (!send_frame(io, reply, nullptr, ch ? ch->address().data() : nullptr))
          break;
        if (ch) {
          ucx = std::move(ch);
          io.ucx = ucx.get();
          // Said once per connection: its frames now cross the fabric unencrypted.
          log::get()->info("{} data plane: {} moved to {} ([security] trusted_fabric: no TLS "
                           "from here on)",
                           node_name_, peer, ucx->transport());
        }
        continue;
      }
      if (offer) {
        // A client on this host offers shared memory: taken if this node
        // allows it and the connection is plaintext on TCP still; declined
        // (the client stays on TCP) otherwise, or if the segment is not one
        // this process can map (another host, another user).
        bool took = false;
        // (More than a segment may be is refused by open(); counted as the
        // most, so the sum cannot overflow.)
        auto offered = static_cast<int64_t>(std::min<uint64_t>(h.version, shm_channel::max_segment_bytes + 1));
        if (!io.shm && !io.ucx && !io.tls && timeouts_.shared_memory
            && shm_mapped_.fetch_add(offered) + offered > timeouts_.max_shm_bytes) {
          shm_mapped_.fetch_sub(offered);
          log::get()->warn("{} data plane: {} stays on TCP: its {} bytes of shared memory would "
                           "take the node past its {} bytes for all clients (max_shm_bytes)",
                           node_name_, peer, offered, timeouts_.max_shm_bytes);
        } else if (!io.shm && !io.ucx && !io.tls && timeouts_.shared_memory) {
          auto ch = shm_channel::open(name, h.version);
          if (ch) {
            shm = std::move(*ch);
            shm_bytes = offered;
            took = true;
          } else {
            shm_mapped_.fetch_sub(offered);
            log::get()->info("{} data plane: {} stays on TCP: {}", node_name_, peer,
                             describe(ch.error()));
          }
        }
        wire::header reply;
        reply.kind = static_cast<uint8_t>(wire::kind::reply);
        reply.version = took ? 1 : 0;
        if (!send_frame(io, reply, nullptr, nullptr))
          break;
        if (took) {
          io.shm = shm.get();
          log::get()->debug("{} data plane: {} is on shared memory", node_name_, peer);
        }
        continue;
      }
      if (wire::aggregator_kind(h.kind)) {
        if (!serve_aggregator(io, peer, h, name))
          break;
        continue;
      }
      if (edge) {
        if (!serve_edge(io, peer, h, name))
          break;
        continue;
      }
      // The variable and the operand's fit are checked before anything is
      // allocated for the operand: a frame for a variable that does not exist,
      // or of another shape, or over a limit, cannot make the node take its
      // memory.
      auto found = dir_->get(name);
      std::string refusal;
      af_error refusal_code = af_error::not_found;
      if (!found.cell) {
        refusal = "no variable '" + name + "' on " + node_name_;
      } else if (h.payload_bytes > static_cast<uint64_t>(timeouts_.max_message_bytes)) {
        refusal_code = af_error::resource_exhausted;
        refusal = fmt::format("{} of '{}': a payload of {} bytes is over {}'s limit of {} bytes per "
                              "message ([node] max_message_bytes)",
                              to_string(static_cast<var_op>(h.kind)), name, h.payload_bytes,
                              node_name_, timeouts_.max_message_bytes);
      } else if (h.has_tensor
                 && h.payload_bytes > static_cast<uint64_t>(timeouts_.max_variable_bytes)) {
        refusal_code = af_error::resource_exhausted;
        refusal = fmt::format("{} of '{}': a value of {} bytes is over {}'s limit of {} bytes per "
                              "variable ([node] max_variable_bytes)",
                              to_string(static_cast<var_op>(h.kind)), name, h.payload_bytes,
                              node_name_, timeouts_.max_variable_bytes);
      } else if (h.has_tensor) {
        const auto& spec = found.cell->spec();
        auto shape = wire::shape_of(h);
        bool scalar = num_elements(shape) == 1 && shape.size() <= spec.shape.size();
        bool update = h.kind == static_cast<uint8_t>(var_op::assign_add)
                      || h.kind == static_cast<uint8_t>(var_op::assign_sub);
        if (static_cast<dtype>(h.dtype) != spec.type) {
          refusal_code = af_error::dtype_mismatch;
          refusal = fmt::format("{} to '{}': value has dtype {}, variable has {}",
                                to_string(static_cast<var_op>(h.kind)), name,
                                dtype_name(static_cast<dtype>(h.dtype)), dtype_name(spec.type));
        } else if (shape != spec.shape && !(scalar && update)) {
          refusal_code = af_error::shape_mismatch;
          refusal = fmt::format("{} to '{}': value has shape {}, variable has {}",
                                to_string(static_cast<var_op>(h.kind)), name, shape_string(shape),
                                shape_string(spec.shape));
        }
      }
      if (!refusal.empty()) {
        read_end how = read_end::done;
        if (!refuse_request(io, refusal_code, refusal, h.payload_bytes, frame_ms, how)) {
          ended(how, "payload");
          break;
        }
        continue;
      }
      if (!h.has_tensor && h.payload_bytes > 0) {
        // Bytes that are no tensor (validate bounds them): skipped.
        read_end how = read_end::done;
        auto skip = skip_payload(io, h.payload_bytes, frame_ms, how);
        if (skip == skipped::lost) {
          ended(how, "payload");
          break;
        }
        if (skip == skipped::too_large) {
          send_error(io, af_error::invalid_argument,
                     "a payload that is no tensor (the connection is closed: its payload was not "
                     "read)");
          break;
        }
      }
      tensor operand;
      if (h.has_tensor) {
        try {
          operand.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
        } catch (const std::bad_alloc&) {
          log::get()->warn("{} data plane: no memory for {} bytes of '{}' from {}", node_name_,
                           h.payload_bytes, name, peer);
          // Answered; the connection goes on if its payload can be skipped.
          read_end how = read_end::done;
          if (!refuse_request(io, af_error::resource_exhausted,
                              fmt::format("{} cannot allocate {} bytes for the operand of '{}' "
                                          "(out of memory)",
                                          node_name_, h.payload_bytes, name),
                              h.payload_bytes, frame_ms, how)) {
            ended(how, "payload");
            break;
          }
          continue;
        }
        if (h.payload_bytes > 0
            && ended(read_timed(io, operand.mutable_bytes(), h.payload_bytes, frame_ms, frame_ms, false),
                     "payload"))
          break;
      }
      // Applied right here under the cell's lock: no actor hop.
      caf::expected<variable_cell::applied> r{caf::error{}};
      try {
        // A request's version field is its id (0: none): applied once per id.
        r = found.cell->apply(static_cast<var_op>(h.kind), operand, h.want_value != 0, h.version);
      } catch (const std::bad_alloc&) {
        // A copy for want_value, a slot: answered, the connection goes on.
        r = make_error(af_error::resource_exhausted,
                       fmt::format("{} ran out of memory applying {} to '{}' ({} bytes)", node_name_,
                                   to_string(static_cast<var_op>(h.kind)), name,
                                   num_elements(found.cell->spec().shape)
                                     * static_cast<int64_t>(dtype_size(found.cell->spec().type))));
      }
      if (!r) {
        if (!send_error(io, wire_code(r.error()), describe(r.error())))
          break;
        continue;
      }
      if (r->first_value && found.actor)
        caf::anon_send(found.actor, released_atom::value); // its waiters: the actor's job
      wire::header reply;
      reply.kind = static_cast<uint8_t>(wire::kind::reply);
      reply.version = r->version;
      const auto& value = r->value;
      if (!value.empty() && !wire::describe_tensor(value, reply)) {
        if (!send_error(io, af_error::invalid_argument,
                        "variable '" + name + "' has rank " + std::to_string(value.shape().size())
                          + "; the data plane carries rank <= 8"))
          break;
        continue;
      }
      // Straight from the variable's buffer: `value` shares it, no copy.
      if (!send_frame(io, reply, nullptr, value.empty() ? nullptr : value.bytes())) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
          log::get()->warn("{} data plane: dropped {}: it took nothing of its reply for {} ms",
                           node_name_, peer, frame_ms);
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    log::get()->warn("{} data plane: out of memory serving {}; closed its connection", node_name_, peer);
    last_words(io, af_error::resource_exhausted, node_name_.c_str(), "out of memory");
  } catch (const std::exception& e) {
    log::get()->error("{} data plane: closed the connection of {}: {}", node_name_, peer, e.what());
    last_words(io, af_error::internal, node_name_.c_str(), e.what());
  }
  std::lock_guard<std::mutex> guard{mtx_};
  conns_.erase(std::remove(conns_.begin(), conns_.end(), fd), conns_.end());
  stream.reset(); // no close_notify: the peer sees the socket close, as in plaintext
  close(fd);
  try {
    finished_.push_back(std::this_thread::get_id());
  } catch (const std::bad_alloc&) {
    // nop: stop() joins this thread instead
  }
}

// -- data_channel ----------------------------------------------------------------

caf::expected<std::unique_ptr<data_channel>>
data_channel::connect(const std::string& host, uint16_t port, std::string peer,
                      std::chrono::milliseconds timeout, std::chrono::microseconds poll,
                      std::shared_ptr<tls_context> tls, bool* untrusted, bool shared_memory,
                      bool trusted_fabric) {
  if (untrusted != nullptr)
    *untrusted = false;
  // One deadline for the TCP connect, the TLS handshake and the node's first
  // record together: `timeout` is the whole connect's.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::chrono::milliseconds{std::max<long long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
        .count(),
      1)};
  };
  auto connected = tcp_connect(host, port, deadline, timeout,
                               "its timeout, for the TCP connect, the TLS handshake and the "
                               "node's first record together");
  if (!connected)
    return make_error(af_error::unreachable, "cannot open the data plane of " + peer + " at " + host
                                               + ":" + std::to_string(port) + ": "
                                               + reason_of(connected.error()));
  int fd = *connected;
  // The session's sends and receives block, bounded by its timeout.
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  set_timeout(fd, SO_RCVTIMEO, timeout);
  set_timeout(fd, SO_SNDTIMEO, timeout);
  std::unique_ptr<secure_stream> stream;
  if (tls) {
    SSL* ssl = SSL_new(tls->native());
    std::string why;
    // Who must answer (tls.hpp): a certificate for the host dialled and, when
    // `peer` starts with a task's name (a session's "/job:ps/task:0 at h:p"),
    // that task's.
    std::string task = peer.rfind("/job:", 0) == 0 ? peer.substr(0, peer.find(' ')) : std::string{};
    if (ssl == nullptr || !tls_set_socket_read_ahead(ssl, fd) || !tls_expect_host(ssl, host))
      why = tls_errors("no TLS session (out of memory?)");
    else {
      why = handshake(ssl, fd, false, left());
      // The node showed a certificate this process does not accept (another
      // CA, another host): the node answering is not the one meant.
      if (!why.empty() && SSL_get_verify_result(ssl) != X509_V_OK && untrusted != nullptr)
        *untrusted = true;
    }
    if (why.empty()) {
      why = tls_wrong_task(ssl, task);
      if (!why.empty() && untrusted != nullptr)
        *untrusted = true;
    }
    if (why.empty()) {
      stream = secure_stream::make(ssl, fd, false, why);
      if (stream) {
        ssl = nullptr; // the stream's now
        why = stream->wait_hello(static_cast<int>(
          std::min<long long>(left().count(), std::numeric_limits<int>::max())));
        // A first record that fails its tag (or is not one of ours): someone
        // between this process and the node, or not the node at all.
        if (!why.empty() && untrusted != nullptr
            && (why.find("failed authentication") != std::string::npos
                || why.find("over the bound") != std::string::npos
                || why.find("not the empty one expected") != std::string::npos))
          *untrusted = true;
      }
    }
    if (why.rfind("the TLS handshake did not finish within", 0) == 0
        || why.rfind("no first record within", 0) == 0)
      why = fmt::format("{} did not finish within {} ms (its timeout, for the TCP connect, the TLS "
                        "handshake and the node's first record together)",
                        why[4] == 'T' ? "the TLS handshake" : "the wait for the node's first record",
                        timeout.count());
    if (!why.empty()) {
      stream.reset();
      SSL_free(ssl);
      close(fd);
      std::string hint;
      if (why.find("wrong version number") != std::string::npos
          || why.find("packet length too long") != std::string::npos
          || why.find("record layer failure") != std::string::npos)
        hint = "; it does not speak TLS: is it run without [security]? Every node of a cluster "
               "needs the same [security]";
      else if (why.find("is not for") == std::string::npos
               && why.find("another member answers") == std::string::npos
               && (why.find("certificate") != std::string::npos
                   || why.find("alert") != std::string::npos))
        hint = "; are its certificate and this process's signed by the same cluster CA ([security] "
               "ca)?";
      return make_error(af_error::unreachable,
                        fmt::format("{}: TLS with the data plane of {} at {}:{} failed: {}{}",
                                    tls->who(), peer, host, port, why, hint));
    }
  }
  std::unique_ptr<data_channel> ch{
    new data_channel(fd, host, port, std::move(peer), timeout, poll, std::move(tls))};
  ch->stream_ = stream.release();
  ch->shm_wanted_ = shared_memory;
  // Offered after the node's first answer, not here: what answers first is
  // then known to be a data plane (a port that never answers costs no wait
  // here, and a stranger's first frame is still a request of the caller's).
  ch->shm_possible_ = shared_memory && ch->stream_ == nullptr
                      && !shm_channel::disabled_by_environment() && shm_channel::same_host(fd);
  // UCX in its place between hosts of a trusted fabric (or wherever the test
  // hook forces it), offered at the same moment (net/ucx_link.hpp).
  ch->ucx_trusted_ = trusted_fabric;
  if ((trusted_fabric || process_trusted_fabric().load()) && !ucx_channel::disabled_by_environment()
      && (ucx_channel::forced_by_environment() || !shm_channel::same_host(fd))
      && !ucx_failed_recently(host + ":" + std::to_string(port))
      && ucx_channel::available()) {
    ch->ucx_possible_ = true;
    ch->shm_possible_ = false;
  }
  return ch;
}

void data_channel::reopen_if_closed_by_peer() {
  // The node drops connections idle for data_idle_timeout_ms (minutes). A
  // channel that has been quiet for a while checks for that EOF before
  // sending, so that the next op goes on a fresh connection instead of
  // failing. Back-to-back ops skip the check (a syscall each).
  if (fd_ < 0 || std::chrono::steady_clock::now() - last_reply_ < std::chrono::milliseconds{100})
    return;
  if (stream_ != nullptr && stream_->has_pending())
    return;
  if (shm_) {
    // On shared memory the socket carries only doorbell bytes, and between
    // calls none is for this side: taken off, so that an EOF behind them shows.
    char bells[64];
    for (;;) {
      auto r = ::recv(fd_, bells, sizeof(bells), MSG_DONTWAIT);
      if (r > 0 || (r < 0 && errno == EINTR))
        continue;
      if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
        reconnect(); // if it fails, the send fails and says why
      return;
    }
  }
  char byte;
  auto r = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
    return; // open (bytes without a request would be the peer's problem to report)
  reconnect(); // if it fails, the send fails and says why
}

bool data_channel::reconnect() {
  auto fresh = connect(host_, port_, peer_, timeout_, poll_, tls_, nullptr, shm_wanted_, ucx_trusted_);
  if (!fresh)
    return false;
  drop();
  std::swap(fd_, (*fresh)->fd_);
  std::swap(stream_, (*fresh)->stream_);
  shm_possible_ = (*fresh)->shm_possible_;
  ucx_possible_ = (*fresh)->ucx_possible_ && !ucx_failed_;
  shm_due_ = false;
  return true;
}

data_link data_channel::io(std::chrono::steady_clock::time_point deadline) const {
  data_link l{fd_, stream_, shm_.get(), ucx_.get()};
  l.deadline = deadline;
  l.cancel = cancel_ ? cancel_.get() : nullptr;
  // A reply is looked for this long before sleeping (as poll_for_reply does
  // on TCP); a little at least, so that a bulk transfer's next piece is
  // usually caught without a doorbell.
  l.spin = std::max(poll_, std::chrono::microseconds{20});
  return l;
}

caf::error data_channel::upgrade_if_due(std::chrono::steady_clock::time_point deadline) {
  bool quiet = std::chrono::steady_clock::now() - last_reply_ >= std::chrono::milliseconds{100};
  auto err = make_offer(deadline);
  // The node may have closed a quiet connection (its idle timeout) just as
  // the offer went out, after reopen_if_closed_by_peer saw no EOF yet. No op
  // was sent: a fresh connection carries it (and offers after its first
  // answer), as a read is sent again after such a close.
  if (err && quiet && fd_ < 0 && is(err, af_error::peer_down) && reconnect())
    return {};
  return err;
}

caf::error data_channel::make_offer(std::chrono::steady_clock::time_point deadline) {
  if (shm_due_ && fd_ >= 0 && ucx_possible_ && !ucx_)
    return offer_ucx(deadline);
  if (!shm_due_ || fd_ < 0 || shm_)
    return {};
  shm_due_ = false;
  shm_possible_ = false; // offered once per connection
  auto seg = shm_channel::create();
  if (!seg) {
    log::get()->info("the data connection to {} stays on TCP: {}", peer_, describe(seg.error()));
    return {};
  }
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::shm_offer);
  h.name_len = static_cast<uint32_t>((*seg)->name().size());
  h.version = (*seg)->segment_bytes();
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  const link tcp{fd_, stream_};
  if (!send_frame(tcp, h, &(*seg)->name(), nullptr, &bound))
    return fail("an offer of shared memory", errno, timeout_, true);
  wire::header r;
  if (!read_all(tcp, &r, sizeof(r), nullptr, &deadline))
    return fail("an offer of shared memory", errno);
  (*seg)->unlink(); // the node has mapped it (or never will): nothing left in /dev/shm
  auto problem = wire::validate(r);
  if (problem.empty() && (r.kind != static_cast<uint8_t>(wire::kind::reply) || r.status != 0
                          || r.payload_bytes != 0 || r.version > 1))
    problem = "not the answer to an offer of shared memory";
  if (!problem.empty()) {
    drop();
    return make_error(af_error::internal, peer_ + " sent a bad data-plane frame: " + problem);
  }
  if (r.version == 1)
    shm_ = std::move(*seg);
  return {};
}

caf::error data_channel::offer_ucx(std::chrono::steady_clock::time_point deadline) {
  shm_due_ = false;
  ucx_possible_ = false; // offered once per connection
  const char* stays = stream_ != nullptr ? "TLS" : "TCP";
  auto mine = ucx_channel::create();
  if (!mine) {
    log::get()->info("the data connection to {} stays on {}: {}", peer_, stays,
                     describe(mine.error()));
    return {};
  }
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::ucx_offer);
  h.payload_bytes = (*mine)->address().size();
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  const link tcp{fd_, stream_};
  if (!send_frame(tcp, h, nullptr, (*mine)->address().data(), &bound))
    return fail("an offer of UCX", errno, timeout_, true);
  wire::header r;
  if (!read_all(tcp, &r, sizeof(r), nullptr, &deadline))
    return fail("an offer of UCX", errno);
  auto problem = wire::validate(r);
  if (problem.empty()
      && (r.kind != static_cast<uint8_t>(wire::kind::reply) || r.status != 0 || r.version > 1
          || r.has_tensor || (r.version == 1) != (r.payload_bytes > 0)
          || r.payload_bytes > ucx_channel::max_address_bytes))
    problem = "not the answer to an offer of UCX";
  if (!problem.empty()) {
    drop();
    return make_error(af_error::internal, peer_ + " sent a bad data-plane frame: " + problem);
  }
  if (r.version == 0) {
    log::get()->info("the data connection to {} stays on {}: the node declined UCX (does it set "
                     "[security] trusted_fabric = true? its log says why)",
                     peer_, stays);
    return {};
  }
  std::string theirs(r.payload_bytes, '\0');
  if (!read_all(tcp, theirs.data(), theirs.size(), nullptr, &deadline))
    return fail("an offer of UCX", errno);
  caf::error err;
  auto& hook = ucx_client_connect_failures_for_testing();
  int fails = hook.load();
  while (fails > 0 && !hook.compare_exchange_weak(fails, fails - 1)) {
  }
  if (fails > 0)
    err = make_error(af_error::unreachable, "a test hook failed this connect");
  else if (auto decoy = take_ucx_decoy_for_testing(); !decoy.empty())
    err = (*mine)->connect(decoy);
  else
    err = (*mine)->connect(theirs);
  if (err) {
    // The node is on UCX now, this end cannot follow: a fresh connection on
    // TCP/TLS carries the op, and this channel offers UCX no more (a path
    // UCX cannot take stays so; said once).
    ucx_failed_ = true;
    remember_ucx_failure(host_ + ":" + std::to_string(port_));
    drop();
    log::get()->warn("the data connection to {} goes on {}: the node took this process's offer of "
                     "UCX, but its worker address is not one UCX can reach from here ({}); "
                     "ACTORFLOW_DATA_UCX=off skips the offer, UCX_NET_DEVICES pins UCX to the "
                     "fabric's interfaces",
                     peer_, stays, describe(err));
    if (reconnect())
      return {};
    return make_error(af_error::unreachable,
                      peer_ + " took this process's offer of UCX, but its answer is not a worker "
                        "address UCX can reach (" + describe(err)
                        + "), and the connection on " + stays + " could not be opened again");
  }
  ucx_ = std::move(*mine);
  ucx_carried_ = false;
  return {};
}

caf::error data_channel::settle(std::chrono::milliseconds wait) {
  if (fd_ < 0 || shm_ || ucx_ || !(shm_possible_ || ucx_possible_))
    return {};
  shm_due_ = true; // as after a first answer: offer before the next request
  return upgrade_if_due(std::chrono::steady_clock::now()
                        + (wait.count() > 0 ? wait : timeout_));
}

std::string data_channel::transport() const {
  return ucx_ ? ucx_->transport() : stream_ != nullptr ? "tls" : shm_ ? "shared memory" : "tcp";
}

void data_channel::poll_for_reply() {
  // A small op's reply comes back within tens of microseconds. Sleeping in
  // recv costs a wake-up, and on a small VM a wake-up across CPUs costs
  // ~20 us (measured: 58 us round trips instead of ~20 us): look for the
  // reply for a moment first, then block.
  if (poll_.count() <= 0 || shm_ || ucx_)
    return; // on shared memory (UCX) the ring's (worker's) read looks for the reply itself
  if (stream_ != nullptr && stream_->has_pending())
    return;
  auto until = std::chrono::steady_clock::now() + poll_;
  char byte;
  do {
    if (::recv(fd_, &byte, 1, MSG_DONTWAIT | MSG_PEEK) != -1 || errno != EAGAIN)
      return; // data, EOF or an error: read_all takes it from here
  } while (std::chrono::steady_clock::now() < until);
}

data_channel::~data_channel() {
  drop();
}

std::string data_channel::tls_description() const {
  if (stream_ == nullptr)
    return {};
  return std::string{SSL_get_version(stream_->ssl())} + " " + SSL_get_cipher_name(stream_->ssl());
}

void data_channel::drop() {
  delete stream_;
  stream_ = nullptr;
  shm_.reset();
  ucx_.reset();
  shm_due_ = false;
  if (fd_ >= 0)
    close(fd_);
  fd_ = -1;
}

caf::error data_channel::fail(const std::string& what, int err, std::chrono::milliseconds waited,
                              bool sending) {
  // A record cut short by the peer's close is still the peer's close
  // (peer_down, which a session's retry knows), with the record layer's words.
  std::string cut = stream_ != nullptr && err == ECONNRESET ? stream_->reason() : std::string{};
  if (ucx_ && !ucx_carried_ && err != ECANCELED) {
    // The first op over UCX failed: the path may not work at all (a port
    // UCX needs that a firewall drops, a NIC the node cannot reach). This
    // channel and fresh ones to the node stay on TCP/TLS a while.
    ucx_failed_ = true;
    remember_ucx_failure(host_ + ":" + std::to_string(port_));
    log::get()->warn("the first op over UCX to {} failed during {} ({}): its data connections go "
                     "on TCP/TLS for the next {} minutes (ACTORFLOW_DATA_UCX=off skips UCX, "
                     "UCX_NET_DEVICES pins it to the fabric's interfaces)",
                     peer_, what, std::strerror(err), ucx_failure_memory.count());
  }
  drop();
  if (err == EPROTO && !last_tls_error.empty()) {
    auto reason = std::move(last_tls_error);
    last_tls_error.clear();
    return make_error(af_error::unreachable,
                      fmt::format("the TLS connection to {} failed during {}: {}{}", peer_, what,
                                  reason,
                                  reason.find("alert") != std::string::npos
                                    ? "; did the node refuse this process's certificate (is it "
                                      "signed by the cluster CA of [security] ca)?"
                                    : ""));
  }
  if (waited.count() <= 0)
    waited = timeout_;
  if (err == ECANCELED)
    return make_error(af_error::cancelled, what + " on " + peer_
                                             + " was abandoned while it was being sent; the "
                                               "connection is opened again for the next call");
  if ((err == EAGAIN || err == EWOULDBLOCK) && sending)
    return make_error(af_error::timeout,
                      fmt::format("timed out after {} ms sending {} to {}: the node stopped "
                                  "reading it (is it stopped, overloaded or unreachable?)",
                                  waited.count(), what, peer_));
  if (err == EAGAIN || err == EWOULDBLOCK)
    return make_error(af_error::timeout, "timed out after " + std::to_string(waited.count())
                                           + " ms waiting for " + peer_ + " to answer " + what
                                           + "; is the node alive and reachable?");
  if (err == EBADMSG && shm_)
    return make_error(af_error::peer_down,
                      "the shared-memory ring with " + peer_ + " is corrupt (found during " + what
                        + "): counters out of range, a flood of doorbell bytes, or a segment "
                          "shrunk or punched by another process; the connection is opened "
                          "again for the next call (ACTORFLOW_DATA_SHM=off keeps it on TCP)");
  return make_error(af_error::peer_down, peer_ + " closed the data connection during " + what + " ("
                                           + (cut.empty() ? std::string{std::strerror(err)} : cut)
                                           + "); did the node stop or die?");
}

caf::expected<std::pair<tensor, uint64_t>>
data_channel::call(var_op op, const std::string& var, const tensor* operand, bool want_value,
                   uint64_t request_id, std::chrono::milliseconds wait) {
  if (!valid_var_op(static_cast<uint8_t>(op)))
    return make_error(af_error::invalid_argument,
                      "unknown variable op code " + std::to_string(static_cast<int>(op)) + " for '"
                        + var + "'");
  auto what = std::string{to_string(op)} + " of '" + var + "'";
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  if (var.size() > wire::max_name)
    return make_error(af_error::invalid_argument, "variable name of " + std::to_string(var.size())
                                                    + " bytes is too long for the data plane");
  // A connection quiet for a while may be closed by the node's idle timeout
  // just as this request goes out (the check below sees no EOF yet). The
  // node then never read it: a read, which changes nothing, is sent again
  // once on a fresh connection. Other ops are not (after a node's crash
  // they might have been applied); their caller sees peer_down.
  bool quiet = std::chrono::steady_clock::now() - last_reply_ >= std::chrono::milliseconds{100};
  reopen_if_closed_by_peer();
  wire::header h;
  h.kind = wire::request_kind(op);
  h.want_value = want_value ? 1 : 0;
  h.name_len = static_cast<uint32_t>(var.size());
  h.version = request_id; // a request's version field carries its id (core/wire_format.hpp)
  if (operand != nullptr && !wire::describe_tensor(*operand, h))
    return make_error(af_error::invalid_argument,
                      what + ": rank " + std::to_string(operand->shape().size())
                        + " is more than the data plane carries (8)");
  // This call's own wait for the reply (a try of a retried update): the
  // channel's timeout again afterwards.
  struct wait_scope {
    data_channel& ch;
    std::chrono::milliseconds saved;
    bool touched = false; ///< SO_RCVTIMEO set to what was left of the try
    ~wait_scope() {
      if (ch.timeout_ == saved && !touched)
        return;
      ch.timeout_ = saved;
      if (ch.fd_ >= 0) {
        set_timeout(ch.fd_, SO_RCVTIMEO, saved);
        set_timeout(ch.fd_, SO_SNDTIMEO, saved);
      }
    }
  } scope{*this, timeout_};
  if (wait.count() > 0 && wait != timeout_) {
    timeout_ = wait;
    set_timeout(fd_, SO_RCVTIMEO, wait);
    set_timeout(fd_, SO_SNDTIMEO, wait);
  }
  // One deadline for the try: the whole send and the reply (a node that
  // stops reading part way through a large operand is not given a fresh
  // wait for each piece it took).
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  if (auto err = upgrade_if_due(deadline))
    return err;
  for (int attempt = 0;; ++attempt) {
    bool retry = attempt == 0 && quiet && op == var_op::read;
    bool large = h.payload_bytes > (std::size_t{1} << 20);
    if (!send_frame(io(deadline), h, &var, operand ? operand->bytes() : nullptr, &bound)) {
      auto err = fail(what, errno, timeout_, true);
      if (retry && reconnect())
        continue;
      return err;
    }
    if (fd_ >= 0 && (large || ms_left(bound) + 20 < timeout_.count())) {
      // The send took a while: the reply gets what is left of the try.
      auto left = std::max<long long>(ms_left(bound), 1);
      set_timeout(fd_, SO_RCVTIMEO, std::chrono::milliseconds{left});
      if (stream_ != nullptr) // the record layer's slices set SO_SNDTIMEO
        set_timeout(fd_, SO_SNDTIMEO, timeout_);
      scope.touched = true;
    }
    auto r = read_reply(what, deadline);
    if (!r && retry && fd_ < 0 && r.error().category() == error_category
        && r.error().code() == static_cast<uint8_t>(af_error::peer_down) && reconnect())
      continue;
    return r;
  }
}

caf::expected<std::pair<tensor, uint64_t>>
data_channel::read_reply(const std::string& what, std::chrono::steady_clock::time_point until) {
  wire::header r;
  poll_for_reply();
  if (cancel_ && !shm_ && !ucx_) { // on shared memory the ring's read looks at cancel_
    // Wait for the reply in slices, so that a cancel is seen within 20 ms;
    // the deadline is the try's (send and reply together).
    for (;;) {
      if (stream_ != nullptr && stream_->has_pending())
        break;
      pollfd pfd{fd_, POLLIN, 0};
      int rc = ::poll(&pfd, 1, 20);
      // EINTR is the Ctrl-C itself (its handler sets the flag checked below).
      if (rc > 0 || (rc < 0 && errno != EINTR))
        break;
      if (std::chrono::steady_clock::now() >= until)
        return fail(what, EAGAIN);
      if (cancel_->load()) {
        drop();
        return make_error(af_error::cancelled, what + " on " + peer_
                                                 + " was abandoned; the connection is opened "
                                                   "again for the next call");
      }
    }
  }
  const link io = this->io(until);
  size_t got = 0;
  if (!read_all(io, &r, sizeof(r), &got)) {
    if (errno == ECANCELED) {
      drop();
      return make_error(af_error::cancelled, what + " on " + peer_
                                               + " was abandoned; the connection is opened "
                                                 "again for the next call");
    }
    int err = errno;
    if (stream_ == nullptr && got >= 2
        && looks_like_tls(reinterpret_cast<const unsigned char*>(&r), got)) {
      drop();
      return make_error(af_error::unreachable,
                        peer_ + " answered " + what + " with TLS: its data plane runs with "
                          "[security]; this process needs the same [security] (the cluster's CA, "
                          "a certificate and key) in its cluster config");
    }
    return fail(what, err);
  }
  auto problem = wire::validate(r);
  if (problem.empty() && r.kind != static_cast<uint8_t>(wire::kind::reply))
    problem = "a request frame sent as a reply";
  if (!problem.empty()) {
    drop();
    return make_error(af_error::internal, peer_ + " sent a bad data-plane frame: " + problem);
  }
  if (r.status != 0) {
    if (!valid_af_error(r.status)) {
      // Not one of our codes: a peer of another version, or not ours at all.
      drop();
      return make_error(af_error::internal,
                        fmt::format("data plane of {}: peer sent an invalid status byte {} in reply "
                                    "to {}",
                                    peer_, static_cast<unsigned>(r.status), what));
    }
    std::string text(r.payload_bytes, '\0');
    if (!read_all(io, text.data(), text.size()))
      return fail(what, errno);
    // The text is describe() of the node's error: drop its "code: " prefix.
    auto code = static_cast<af_error>(r.status);
    auto prefix = std::string{to_string(code)} + ": ";
    if (text.rfind(prefix, 0) == 0)
      text = text.substr(prefix.size());
    return make_error(code, text);
  }
  tensor value;
  if (r.has_tensor) {
    try {
      value.reset(static_cast<dtype>(r.dtype), wire::shape_of(r));
    } catch (const std::bad_alloc&) {
      drop(); // the payload is still in the stream
      return make_error(af_error::resource_exhausted, what + ": cannot allocate "
                                                        + std::to_string(r.payload_bytes)
                                                        + " bytes for the reply (out of memory)");
    }
    if (r.payload_bytes > 0
        && !read_all(io, value.mutable_bytes(), r.payload_bytes, nullptr, &until))
      return fail(what, errno);
  }
  last_reply_ = std::chrono::steady_clock::now();
  if (ucx_)
    ucx_carried_ = true;
  if ((shm_possible_ && !shm_) || (ucx_possible_ && !ucx_))
    shm_due_ = true; // a data plane answered: offer shared memory before the next request
  return std::make_pair(std::move(value), r.version);
}

caf::error data_channel::send_edge(const std::string& device, uint64_t graph,
                                   const std::string& token, uint64_t step, int32_t op,
                                   int64_t sent_ns, const tensor& value,
                                   std::chrono::milliseconds wait) {
  auto what = fmt::format("the value of op {} (step {} of graph {}) for {}", op, step, graph, device);
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  if (device.size() + sizeof(wire::edge_prefix) > wire::max_name)
    return make_error(af_error::invalid_argument, what + ": the device name is too long for the data plane");
  reopen_if_closed_by_peer();
  wire::edge_prefix pre;
  pre.graph = graph;
  pre.sent_ns = sent_ns;
  pre.op = op;
  if (token.size() != sizeof(pre.token))
    return make_error(af_error::invalid_argument,
                      what + ": the graph's edge token has " + std::to_string(token.size())
                        + " bytes, not " + std::to_string(sizeof(pre.token)));
  std::memcpy(pre.token, token.data(), sizeof(pre.token));
  std::string name(sizeof(pre), '\0');
  std::memcpy(name.data(), &pre, sizeof(pre));
  name += device;
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::edge);
  h.name_len = static_cast<uint32_t>(name.size());
  h.version = step;
  if (!value.empty() && !wire::describe_tensor(value, h))
    return make_error(af_error::invalid_argument,
                      what + ": rank " + std::to_string(value.shape().size())
                        + " is more than the data plane carries (8)");
  auto saved = timeout_;
  if (wait.count() > 0 && wait != timeout_) {
    timeout_ = wait;
    set_timeout(fd_, SO_RCVTIMEO, wait);
    set_timeout(fd_, SO_SNDTIMEO, wait);
  }
  auto restore = [&] {
    timeout_ = saved;
    if (fd_ >= 0) {
      set_timeout(fd_, SO_RCVTIMEO, saved);
      set_timeout(fd_, SO_SNDTIMEO, saved);
    }
  };
  // One deadline for the send and the ack together.
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  if (auto err = upgrade_if_due(deadline)) {
    restore();
    return err;
  }
  if (!send_frame(io(deadline), h, &name, value.empty() ? nullptr : value.bytes(), &bound)) {
    auto err = fail(what, errno, timeout_, true);
    restore();
    return err;
  }
  if (fd_ >= 0)
    set_timeout(fd_, SO_RCVTIMEO, std::chrono::milliseconds{std::max<long long>(ms_left(bound), 1)});
  auto r = read_reply(what, deadline);
  restore();
  if (!r)
    return std::move(r.error());
  return {};
}

caf::expected<std::pair<uint64_t, tensor>>
data_channel::aggregate(wire::kind kind, const std::string& name, uint32_t worker, uint64_t step,
                        const std::vector<tensor>& values, std::chrono::milliseconds wait,
                        const std::string& token, uint64_t seq) {
  bool push = kind == wire::kind::push || kind == wire::kind::push_params;
  auto what = fmt::format("{} of worker {} to aggregator '{}'", push ? "push" : "pull", worker, name);
  if (!wire::aggregator_kind(static_cast<uint8_t>(kind)))
    return make_error(af_error::invalid_argument, what + ": not a push or pull frame");
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  wire::push_prefix pre;
  if (name.size() + (push ? sizeof(pre) : 0) > wire::max_name || worker > UINT16_MAX)
    return make_error(af_error::invalid_argument, what + ": name or worker index too large");
  if (push && token.size() != sizeof(pre.token))
    return make_error(af_error::invalid_argument,
                      fmt::format("{}: a token of {} bytes, expected the {} its join was "
                                  "answered with (join the aggregator before pushing)",
                                  what, token.size(), sizeof(pre.token)));
  reopen_if_closed_by_peer();
  wire::header h;
  h.kind = static_cast<uint8_t>(kind);
  h.name_len = static_cast<uint32_t>(name.size() + (push ? sizeof(pre) : 0));
  h.version = step;
  h.reserved = static_cast<uint16_t>(worker);
  std::vector<iovec> iov;
  iov.reserve(values.size() + 3);
  iov.push_back({&h, sizeof(h)});
  if (push) {
    std::memcpy(pre.token, token.data(), sizeof(pre.token));
    pre.seq = seq;
    iov.push_back({&pre, sizeof(pre)});
  }
  if (!name.empty())
    iov.push_back({const_cast<char*>(name.data()), name.size()});
  if (push && !values.empty()) {
    uint64_t floats = 0;
    for (const auto& v : values) {
      if (v.type() != dtype::float32)
        return make_error(af_error::dtype_mismatch, what + ": values must be float32, got "
                                                      + v.summary());
      floats += v.num_elements();
      if (v.nbytes() > 0)
        iov.push_back({const_cast<std::byte*>(v.bytes()), v.nbytes()});
    }
    h.has_tensor = 1;
    h.dtype = static_cast<uint8_t>(dtype::float32);
    h.rank = 1;
    h.dims[0] = static_cast<int64_t>(floats);
    h.payload_bytes = floats * sizeof(float);
  }
  // A sync push waits for the other workers: widen this call's receive timeout.
  // The node answers (its own timeout, naming the missing workers) by wait + 2 s:
  // wait longer, so that its reason arrives rather than a bare socket timeout.
  auto wait_for = std::max(wait + std::chrono::seconds(5), timeout_);
  set_timeout(fd_, SO_RCVTIMEO, wait_for);
  auto deadline = std::chrono::steady_clock::now() + wait_for;
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  if (auto err = upgrade_if_due(deadline))
    return err;
  bool sent = write_all(io(deadline), iov.data(), static_cast<int>(iov.size()), &bound);
  if (!sent) {
    auto err = fail(what, errno, wait_for, true);
    return err;
  }
  if (stream_ != nullptr && h.payload_bytes > (std::size_t{1} << 20))
    set_timeout(fd_, SO_SNDTIMEO, timeout_);
  auto r = read_reply(what, deadline);
  if (fd_ >= 0)
    set_timeout(fd_, SO_RCVTIMEO, timeout_);
  if (!r)
    return std::move(r.error());
  return std::make_pair(r->second, std::move(r->first));
}

} // namespace af
