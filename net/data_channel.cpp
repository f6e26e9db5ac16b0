/// The session's side of the data plane: a connection to one node's data
/// plane (TCP, TLS), kept open across ops, opened again when the node closed
/// it, and the errors of its failures.
#include "net/data_plane.hpp"
#include "net/data_link.hpp"
#include "net/tcp_connect.hpp"
#include "net/tls_io.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

using namespace plane_io;

// -- data_channel ----------------------------------------------------------------

namespace {

/// What became of connect's TLS half: the stream, or why not and its kind,
/// both set where the failure is found (never read back from the words).
struct tls_open {
  std::unique_ptr<secure_stream> stream;
  std::string why;
  tls_failure kind = tls_failure::none;
  bool in_handshake = true; ///< false: the failure came after it (the node's first record)
};

/// The TLS half of data_channel::connect on connected socket `fd`: the
/// handshake (a certificate of the cluster CA for `host` and, when `peer`
/// starts with a task's name, that task's), then the node's first record,
/// all within `left()`.
tls_open open_tls(const tls_context& tls, int fd, const std::string& host,
                  const std::string& peer,
                  const std::function<std::chrono::milliseconds()>& left) {
  tls_open out;
  SSL* ssl = SSL_new(tls.native());
  // Who must answer (tls.hpp): a certificate for the host dialled and, when
  // `peer` starts with a task's name (a session's "/job:ps/task:0 at h:p"),
  // that task's.
  std::string task = peer.rfind("/job:", 0) == 0 ? peer.substr(0, peer.find(' ')) : std::string{};
  if (ssl == nullptr || !tls_set_socket_read_ahead(ssl, fd) || !tls_expect_host(ssl, host)) {
    out.why = tls_errors("no TLS session (out of memory?)");
    out.kind = tls_failure::internal;
  } else {
    // A certificate this process does not accept (another CA, another
    // host) comes back as wrong_name or unknown_ca: not the node meant.
    out.why = tls_handshake(ssl, fd, false, left(), &out.kind);
  }
  if (out.why.empty()) {
    out.why = tls_wrong_task(ssl, task);
    if (!out.why.empty())
      out.kind = tls_failure::wrong_name;
  }
  if (out.why.empty()) {
    out.stream = secure_stream::make(ssl, fd, false, out.why);
    if (!out.stream) {
      out.kind = tls_failure::internal;
    } else {
      ssl = nullptr; // the stream's now
      out.in_handshake = false;
      out.why = out.stream->wait_hello(static_cast<int>(
        std::min<long long>(left().count(), std::numeric_limits<int>::max())));
      // A first record that fails its tag (or is not one of ours): someone
      // between this process and the node, or not the node at all
      // (forged_record, an impostor).
      if (!out.why.empty())
        out.kind = out.stream->failure();
    }
  }
  if (!out.why.empty()) {
    out.stream.reset();
    SSL_free(ssl);
    if (out.kind == tls_failure::none)
      out.kind = tls_failure::handshake;
  }
  return out;
}

/// connect_failure of a TLS failure of kind `k`.
connect_failure failure_of(tls_failure k) {
  if (is_impostor(k))
    return connect_failure::impostor;
  switch (k) {
    case tls_failure::refused:
      return connect_failure::refused;
    case tls_failure::protocol:
      return connect_failure::protocol;
    case tls_failure::timeout:
      return connect_failure::timeout;
    case tls_failure::closed:
    case tls_failure::io:
      return connect_failure::closed;
    case tls_failure::internal:
      return connect_failure::internal;
    default:
      return connect_failure::tls_handshake;
  }
}

} // namespace

const char* to_string(connect_failure f) {
  switch (f) {
    case connect_failure::none:
      return "none";
    case connect_failure::unreachable:
      return "unreachable";
    case connect_failure::impostor:
      return "impostor";
    case connect_failure::refused:
      return "refused";
    case connect_failure::protocol:
      return "protocol";
    case connect_failure::tls_handshake:
      return "tls_handshake";
    case connect_failure::timeout:
      return "timeout";
    case connect_failure::closed:
      return "closed";
    case connect_failure::internal:
      return "internal";
  }
  return "?";
}

caf::expected<std::unique_ptr<data_channel>>
data_channel::connect(const std::string& host, uint16_t port, std::string peer,
                      std::chrono::milliseconds timeout, std::chrono::microseconds poll,
                      std::shared_ptr<tls_context> tls, connect_failure* failure,
                      bool shared_memory, bool trusted_fabric) {
  if (failure != nullptr)
    *failure = connect_failure::none;
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
  if (!connected) {
    if (failure != nullptr)
      *failure = connect_failure::unreachable;
    return make_error(af_error::unreachable, "cannot open the data plane of " + peer + " at " + host
                                               + ":" + std::to_string(port) + ": "
                                               + reason_of(connected.error()));
  }
  int fd = *connected;
  // The session's sends and receives block, bounded by its timeout.
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  set_timeout(fd, SO_RCVTIMEO, timeout);
  set_timeout(fd, SO_SNDTIMEO, timeout);
  std::unique_ptr<secure_stream> stream;
  if (tls) {
    auto opened = open_tls(*tls, fd, host, peer, left);
    if (!opened.stream) {
      close(fd);
      auto why = std::move(opened.why);
      if (opened.kind == tls_failure::timeout)
        why = fmt::format("{} did not finish within {} ms (its timeout, for the TCP connect, the "
                          "TLS handshake and the node's first record together)",
                          opened.in_handshake ? "the TLS handshake"
                                              : "the wait for the node's first record",
                          timeout.count());
      std::string hint;
      if (opened.kind == tls_failure::protocol)
        hint = "; it does not speak TLS: is it run without [security]? Every node of a cluster "
               "needs the same [security]";
      else if (opened.kind == tls_failure::unknown_ca || opened.kind == tls_failure::refused)
        hint = "; are its certificate and this process's signed by the same cluster CA ([security] "
               "ca)?";
      if (failure != nullptr)
        *failure = failure_of(opened.kind);
      return make_error(af_error::unreachable,
                        fmt::format("{}: TLS with the data plane of {} at {}:{} failed: {}{}",
                                    tls->who(), peer, host, port, why, hint));
    }
    stream = std::move(opened.stream);
  }
  std::unique_ptr<data_channel> ch{
    new data_channel(fd, host, port, std::move(peer), timeout, poll, std::move(tls))};
  ch->stream_ = stream.release();
  if (ch->stream_ != nullptr) {
    ch->stream_bytes_ = tls_bytes(*ch->stream_);
    ch->bytes_ = ch->stream_bytes_.get();
  }
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
  restore_timeouts(); // every op passes here first: a call's wait left on the socket goes
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
  std::swap(stream_bytes_, (*fresh)->stream_bytes_);
  std::swap(bytes_, (*fresh)->bytes_);
  shm_possible_ = (*fresh)->shm_possible_;
  ucx_possible_ = (*fresh)->ucx_possible_ && !ucx_failed_;
  shm_due_ = false;
  // Requests out on the old connection are lost with it; the fresh one
  // waits the channel's timeout.
  pending_.clear();
  pending_rcv_ = std::chrono::milliseconds{0};
  // Its socket has timeout_ (a wait_scope's own while one is open).
  if (!in_scope_)
    call_wait_ = std::chrono::milliseconds{0};
  return true;
}

data_link data_channel::io(std::chrono::steady_clock::time_point deadline) const {
  data_link l{fd_, bytes_};
  l.deadline = deadline;
  l.cancel = cancel_ ? cancel_.get() : nullptr;
  // A reply is looked for this long before sleeping (as poll_for_reply does
  // on TCP); a little at least, so that a bulk transfer's next piece is
  // usually caught without a doorbell.
  l.spin = std::max(poll_, std::chrono::microseconds{20});
  return l;
}

void data_channel::move_to(std::unique_ptr<byte_channel> b) {
  moved_bytes_ = std::move(b);
  bytes_ = moved_bytes_.get();
}

std::string data_channel::transport() const {
  return bytes_->name();
}

size_t data_channel::poll_for_reply(void* head, size_t n) {
  // A small op's reply comes back within tens of microseconds. Sleeping in
  // recv costs a wake-up, and on a small VM a wake-up across CPUs costs
  // ~20 us (measured: 58 us round trips instead of ~20 us): look for the
  // reply for a moment first, then block. A yield between looks: when the
  // node's thread shares this CPU it runs at once, where a plain loop
  // would hold it off for the whole spin (measured, with the node's thread
  // spinning for the next frame too: 64 us round trips in two runs of six
  // without the yield, 11-20 us in six of six with it). On a plain socket
  // a look reads the header itself (a peek and then the read would be two
  // system calls); over TLS it peeks at the socket for a record.
  if (poll_.count() <= 0 || bytes_->waits_itself())
    return 0; // on shared memory (UCX) the ring's (worker's) read looks for the reply itself
  if (bytes_->has_pending())
    return 0;
  bool plain = bytes_ == &tcp_bytes();
  auto until = std::chrono::steady_clock::now() + poll_;
  char byte;
  do {
    auto r = plain ? ::recv(fd_, head, n, MSG_DONTWAIT)
                   : ::recv(fd_, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    if (r > 0)
      return plain ? static_cast<size_t>(r) : 0;
    if (r == 0 || errno != EAGAIN)
      return 0; // EOF or an error: the read that follows sees it (again) and says so
    sched_yield();
  } while (std::chrono::steady_clock::now() < until);
  return 0;
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
  bytes_ = &tcp_bytes();
  moved_bytes_.reset();
  stream_bytes_.reset();
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
    auto kind = std::exchange(last_tls_failure, tls_failure::none);
    return make_error(af_error::unreachable,
                      fmt::format("the TLS connection to {} failed during {}: {}{}", peer_, what,
                                  reason,
                                  // (an alert, or a TLS record where ours were due)
                                  kind == tls_failure::refused || kind == tls_failure::protocol
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
                        + "): counters out of range, a flood of doorbell bytes, a reply "
                          "naming an answer slot the node had not handed over (or one still "
                          "lent), or a segment shrunk or punched by another process; the connection is opened "
                          "again for the next call (ACTORFLOW_DATA_SHM=off keeps it on TCP)");
  return make_error(af_error::peer_down, peer_ + " closed the data connection during " + what + " ("
                                           + (cut.empty() ? std::string{std::strerror(err)} : cut)
                                           + "); did the node stop or die?");
}

} // namespace af
