#include "net/caf_port_scribe.hpp"
#include "net/tls.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "caf/all.hpp"
#include "caf/io/basp/header.hpp"
#include "caf/io/basp/message_type.hpp"
#include "caf/io/basp_broker.hpp"
#include "caf/io/network/default_multiplexer.hpp"
#include "caf/io/network/native_socket.hpp"
#include "caf/io/network/scribe_impl.hpp"
#include "caf/io/network/stream_impl.hpp"

#include "core/log.hpp"

namespace af {

namespace caf_port_detail {

namespace net = caf::io::network;
using net::native_socket;
using net::rw_state;

namespace {

/// A scribe's hold on its entry: released when the handshake went through,
/// and when the scribe goes (declared after its stream, so before the
/// stream closes the socket).
class deadline_token {
public:
  deadline_token() = default;
  explicit deadline_token(std::shared_ptr<pending_handshake> p) : p_(std::move(p)) {}
  deadline_token(const deadline_token&) = delete;
  deadline_token& operator=(const deadline_token&) = delete;
  ~deadline_token() { release(); }

  void release() {
    if (!p_)
      return;
    {
      std::lock_guard<std::mutex> guard{p_->mtx};
      p_->live = false;
    }
    if (!timed_out())
      p_.reset();
  }

  /// Keeps why the TLS handshake failed, for whoever opened the connection
  /// (the BASP broker only says "disconnect during handshake").
  void note_failure(std::string why) const {
    if (!p_)
      return;
    std::lock_guard<std::mutex> guard{p_->mtx};
    p_->failure = std::move(why);
  }

  /// Whether the deadline closed it (its failure then says nothing new).
  bool timed_out() const {
    if (!p_)
      return false;
    std::lock_guard<std::mutex> guard{p_->mtx};
    return p_->timed_out;
  }

private:
  std::shared_ptr<pending_handshake> p_;
};
/// The pre-handshake cap, shared by the plaintext and the TLS scribe. BASP
/// asks its scribe for a header, then for the payload the header announced;
/// CAF 0.17.6 does not refuse other messages (a heartbeat) before the client's
/// handshake. So every read is capped until the broker has taken the payload
/// of a client_handshake (told by the header it just got, byte 0); from then
/// on the broker's own checks and [node] max_message_bytes apply.
class handshake_guard {
public:
  /// `outbound`: a connection this process opened, whose peer's handshake
  /// is BASP's server_handshake (an accepted one's is the client's).
  explicit handshake_guard(std::shared_ptr<const caf_port_options> opts, bool outbound = false)
    : opts_(std::move(opts)),
      awaited_(outbound ? caf::io::basp::message_type::server_handshake
                        : caf::io::basp::message_type::client_handshake),
      outbound_(outbound) {}

  /// The read to configure instead of `config`: itself, or one byte after
  /// the socket was shut down (the broker then sees an ordinary close).
  /// `delivered` is what the broker was just handed (the scribe's message).
  /// The deadline's hold on this connection, released once the peer's
  /// handshake went through (accepted connections only).
  void watch(deadline_token* token) { token_ = token; }

  /// An outbound connection's connect deadline (connect_scribe's): until
  /// then the BASP broker's heartbeat does not close it for silence.
  void hold_until(std::chrono::steady_clock::time_point deadline) { hold_until_ = deadline; }

  /// CAF 0.17.6's BASP broker, at each heartbeat tick, closes every
  /// connection whose last_seen + middleman.connection-timeout is past, with
  /// sec::connection_timeout. Its connect_atom handler makes the context of
  /// a connection it is handed without setting last_seen (the clock's
  /// epoch), so the first tick (within heartbeat_ms, 1 s by default) closed
  /// a connection whose peer had not answered yet, long before
  /// connect_timeout, and the session said the handshake did not come within
  /// connect_timeout. The handler asks its scribe for the first header right
  /// after making the context: here the context gets the connect's deadline
  /// as last seen, so the tick leaves it alone until the deadline (when
  /// opened_connection::settle shuts it down) and the heartbeat plus
  /// connection_timeout applies from the peer's first message on (the
  /// broker sets last_seen on each).
  void hold_in_broker(caf::io::abstract_broker* broker, caf::io::connection_handle hdl) {
    if (!outbound_ || held_ || broker == nullptr)
      return;
    held_ = true;
    auto* basp = dynamic_cast<caf::io::basp_broker*>(broker);
    if (basp == nullptr)
      return;
    auto i = basp->ctx.find(hdl);
    if (i != basp->ctx.end() && i->second.last_seen < hold_until_)
      i->second.last_seen = hold_until_;
  }

  caf::io::receive_policy::config check(caf::io::receive_policy::config config, native_socket fd,
                                        const std::vector<char>& delivered) {
    if (refused_)
      return {caf::io::receive_policy_flag::exactly, 1};
    if (handshake_payload_next_ && !done_) {
      done_ = true; // the client's handshake went through the broker
      if (token_ != nullptr)
        token_->release();
    }
    if (done_) {
      if (config.second <= opts_->max_message_bytes)
        return config;
      log::get()->warn("closed the CAF connection of {}: it announces a message of {} bytes (at "
                       "most {}, [node] max_message_bytes)",
                       peer_of(fd), config.second, opts_->max_message_bytes);
      return refuse(fd);
    }
    if (delivered.size() == caf::io::basp::header_size
        && static_cast<uint8_t>(delivered[0]) == static_cast<uint8_t>(awaited_))
      handshake_payload_next_ = true;
    if (config.second <= opts_->max_handshake_bytes)
      return config;
    auto who = outbound_ ? "closed the CAF connection to " + peer_of(fd)
                         : "refused " + peer_of(fd) + " on the CAF port";
    log::get()->warn("{}: it announces a message of {} bytes before its handshake (at most {}, "
                     "[node] max_handshake_bytes); closed unread",
                     who, config.second, opts_->max_handshake_bytes);
    done_ = true;
    return refuse(fd);
  }

private:
  caf::io::receive_policy::config refuse(native_socket fd) {
    refused_ = true;
    ::shutdown(fd, SHUT_RDWR);
    return {caf::io::receive_policy_flag::exactly, 1};
  }

  std::shared_ptr<const caf_port_options> opts_;
  caf::io::basp::message_type awaited_;
  bool outbound_;
  deadline_token* token_ = nullptr;
  std::chrono::steady_clock::time_point hold_until_{};
  bool held_ = false;
  bool handshake_payload_next_ = false;
  bool done_ = false;
  bool refused_ = false;
};

class plain_scribe : public net::scribe_impl {
public:
  /// `pending`: its entry until the peer's handshake went through.
  plain_scribe(net::default_multiplexer& mpx, native_socket fd,
               std::shared_ptr<const caf_port_options> opts, bool outbound,
               std::shared_ptr<pending_handshake> pending)
    : net::scribe_impl(mpx, fd), guard_(std::move(opts), outbound), token_(std::move(pending)) {
    guard_.watch(&token_);
  }

  void configure_read(caf::io::receive_policy::config config) override {
    guard_.hold_in_broker(parent(), hdl());
    net::scribe_impl::configure_read(guard_.check(config, stream_.fd(), msg().buf));
  }

  void hold_until(std::chrono::steady_clock::time_point deadline) { guard_.hold_until(deadline); }

private:
  handshake_guard guard_;
  deadline_token token_; // goes before the base's stream closes the socket
};

/// TLS on one CAF connection, in the non-blocking states of CAF's
/// openssl::session (its read_some/write_some contract: want-read or
/// want-write is `success` with nothing moved, a zero-length write during the
/// handshake `indeterminate`), but:
/// - on the process's TLS context (net/tls.hpp: the data plane's, loaded
///   and checked once at start-up) instead of a context loaded from the
///   files for every connection, so both ports agree on versions and suites;
/// - each call starts with an empty OpenSSL error queue. The queue is the
///   thread's, and every CAF connection of a process runs on the
///   multiplexer's one thread; CAF's session judges a call by SSL_get_error,
///   which reads that queue, and never empties it. So the reason one peer's
///   connection failed (a ps killed: its reset, its missing close_notify)
///   was still queued when the next connection read nothing yet, and that
///   healthy connection was taken as failed and closed, losing the message
///   in flight (a worker's ping of its chief as the ps died);
/// - on a connection this process opens, the peer must be who it dials:
///   OpenSSL checks the certificate's subjectAltName against the host (an
///   IP address or a DNS name), and a CN that names a task
///   (/job:J/task:T, as actorflow-certs writes) must name the task called.
///   libcaf-openssl checks no name: any member could pose as any task.
class tls_session {
public:
  /// `host` and `task`: whom a connection this process opens must reach
  /// (empty for an accepted one). Null: out of memory.
  static std::unique_ptr<tls_session> make(const tls_context& ctx, native_socket fd,
                                           const std::string& host, const std::string& task) {
    std::unique_ptr<tls_session> out{new tls_session};
    out->ssl_ = SSL_new(ctx.native());
    if (out->ssl_ == nullptr || !tls_set_socket(out->ssl_, fd))
      return nullptr;
    SSL_set_mode(out->ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (host.empty()) {
      SSL_set_accept_state(out->ssl_);
    } else {
      SSL_set_connect_state(out->ssl_);
      if (!tls_expect_host(out->ssl_, host)) // the data plane's check too (tls.hpp)
        return nullptr;
      out->task_ = task;
      out->outbound_ = true;
    }
    return out;
  }

  ~tls_session() { SSL_free(ssl_); }
  tls_session(const tls_session&) = delete;
  tls_session& operator=(const tls_session&) = delete;

  rw_state read_some(size_t& result, void* buf, size_t len) {
    return some(false, result, buf, len);
  }

  rw_state write_some(size_t& result, const void* buf, size_t len) {
    return some(true, result, const_cast<void*>(buf), len);
  }

  bool must_read_more(size_t threshold) {
    return static_cast<size_t>(SSL_pending(ssl_)) >= threshold;
  }

  /// Whether the handshake waits for the peer's bytes: until they come,
  /// nothing can be written (tls_stream stops watching writability).
  bool handshake_wants_read() const { return handshaking_ && wants_read_; }

  /// Why the handshake failed (OpenSSL's verification result or error
  /// queue, or the task check), once; empty if it did not.
  std::string take_failure() { return std::exchange(failure_, {}); }

private:
  tls_session() = default;

  rw_state some(bool write, size_t& result, void* buf, size_t len) {
    result = 0;
    ERR_clear_error();
    if (handshaking_) {
      int ret = SSL_do_handshake(ssl_);
      wants_read_ = false;
      if (ret != 1) {
        int err = SSL_get_error(ssl_, ret);
        wants_read_ = err == SSL_ERROR_WANT_READ;
        if (err == SSL_ERROR_WANT_READ)
          return len == 0 && write ? rw_state::indeterminate : rw_state::success;
        if (err == SSL_ERROR_WANT_WRITE)
          return rw_state::success;
        auto kind = tls_failure::none;
        failure_ = tls_handshake_failure(ssl_, ret, &kind);
        // The connection closed and not a byte came back to our
        // ClientHello: the node never spoke TLS to us, so no certificate was
        // judged (a node out of descriptors accepts and closes at once). A
        // failure of our own before any read (SSL_ERROR_SSL) is not that.
        if (outbound_ && (err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN)
            && BIO_number_read(SSL_get_rbio(ssl_)) == 0)
          failure_ = "the node closed the connection before a byte of its TLS handshake"
                     + (kind == tls_failure::closed ? std::string{} : " (" + failure_ + ")")
                     + ": it may be out of file descriptors or at its connection limit";
        return rw_state::failure;
      }
      handshaking_ = false;
      if (auto wrong = wrong_task(); !wrong.empty()) {
        failure_ = wrong;
        return rw_state::failure;
      }
    }
    if (len == 0)
      return rw_state::indeterminate;
    size_t n = 0;
    int ret = write ? SSL_write_ex(ssl_, buf, len, &n) : SSL_read_ex(ssl_, buf, len, &n);
    if (ret == 1) {
      result = n;
      return rw_state::success;
    }
    int err = SSL_get_error(ssl_, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE)
      return rw_state::success;
    ERR_clear_error(); // a closed or failed connection: nothing for the next call to see
    return rw_state::failure;
  }

  /// Empty if the peer's certificate may be `task_`'s, else why not.
  std::string wrong_task() const { return tls_wrong_task(ssl_, task_); }

  SSL* ssl_ = nullptr;
  bool handshaking_ = true;
  bool wants_read_ = false;
  bool outbound_ = false; ///< a connection this process opened
  std::string task_;
  std::string failure_;
};

/// At most 10 refusal lines a second: a stranger that connects and closes
/// in a loop (hundreds a second) would fill the log. The lines left out are
/// counted, and the next line written says how many.
class refusal_log {
public:
  /// Whether to write a line now; `skipped`: how many were left out before it.
  static bool allow(uint64_t& skipped) {
    static std::mutex mtx;
    static std::chrono::steady_clock::time_point window;
    static int used = 0;
    static uint64_t left_out = 0;
    std::lock_guard<std::mutex> guard{mtx};
    auto now = std::chrono::steady_clock::now();
    if (now - window >= std::chrono::seconds{1}) {
      window = now;
      used = 0;
    }
    if (used >= 10) {
      ++left_out;
      return false;
    }
    ++used;
    skipped = std::exchange(left_out, 0);
    return true;
  }
};

/// tls_session as the stream's protocol, which says who failed the TLS
/// handshake and why.
class logging_tls_policy {
public:
  logging_tls_policy(std::unique_ptr<tls_session> session,
                     std::shared_ptr<const caf_port_options> opts, bool outbound,
                     const deadline_token* token, std::string peer)
    : session_(std::move(session)), opts_(std::move(opts)), outbound_(outbound), token_(token),
      peer_(std::move(peer)) {
    // nop
  }

  rw_state read_some(size_t& result, native_socket fd, void* buf, size_t len) {
    auto st = session_->read_some(result, buf, len);
    if (st == rw_state::success && result > 0)
      established_ = true;
    else if (st == rw_state::failure)
      refused(fd);
    return st;
  }

  rw_state write_some(size_t& result, native_socket fd, const void* buf, size_t len) {
    auto st = session_->write_some(result, buf, len);
    // SSL_write succeeds only once the handshake is done (the node writes
    // BASP's server handshake first): a peer that leaves after it was not refused.
    if (st == rw_state::success && result > 0)
      established_ = true;
    else if (st == rw_state::failure)
      refused(fd);
    return st;
  }

  bool must_read_more(native_socket, size_t threshold) {
    return session_->must_read_more(threshold);
  }

  bool handshake_wants_read() const { return session_->handshake_wants_read(); }

private:
  void refused(native_socket) { // peer_ names it: the socket may be shut down by now
    // After the deadline closed it, its line said so already.
    if (established_ || reported_ || (token_ != nullptr && token_->timed_out())) {
      ERR_clear_error();
      return;
    }
    reported_ = true;
    auto why = session_->take_failure();
    if (why.empty())
      why = tls_errors("the connection closed during the TLS handshake");
    if (outbound_) {
      if (token_ != nullptr)
        token_->note_failure(std::move(why));
      return;
    }
    uint64_t skipped = 0;
    if (refusal_log::allow(skipped))
      log::get()->warn("refused {} on the CAF port: TLS handshake failed ({}); a peer needs a "
                       "certificate of the cluster CA{}",
                       peer_, why,
                       skipped > 0 ? fmt::format(" ({} more refusals not logged before this one)",
                                                 skipped)
                                   : "");
  }

  std::unique_ptr<tls_session> session_;
  std::shared_ptr<const caf_port_options> opts_;
  bool outbound_;
  const deadline_token* token_;
  std::string peer_; ///< taken at the start: a peer that left has no address
  bool established_ = false;
  bool reported_ = false;
};

/// CAF's stream with logging_tls_policy, except while the TLS handshake
/// waits for the peer. Then a write of BASP's bytes can move nothing, and
/// CAF's stream has no answer for that: `success` with 0 bytes keeps the
/// socket watched for writability, which it always has, so the multiplexer
/// called the write again at once (one core busy for the whole connect to a
/// node that does not answer: ~1400 wake-ups a second, issue 11 #4), and
/// `indeterminate` drops the buffer. So the write interest is dropped until
/// a read event moves the handshake on, keeping the bytes and the writer.
class tls_stream : public net::stream {
public:
  template <class... Ts>
  tls_stream(net::default_multiplexer& mpx, native_socket fd, Ts&&... xs)
    : net::stream(mpx, fd), policy_(std::forward<Ts>(xs)...) {
    // nop
  }

  void handle_event(net::operation op) override {
    if (op == net::operation::write && policy_.handshake_wants_read()) {
      if (!write_paused_) {
        write_paused_ = true;
        backend().del(net::operation::write, fd(), this);
      }
      return;
    }
    handle_event_impl(op, policy_);
    if (op == net::operation::read && write_paused_ && !policy_.handshake_wants_read()) {
      write_paused_ = false;
      backend().add(net::operation::write, fd(), this);
    }
  }

  void removed_from_loop(net::operation op) override {
    if (op == net::operation::write && write_paused_)
      return; // paused here: the stream still writes (and holds its writer)
    if (op == net::operation::read && write_paused_) {
      // Closed while paused: the write side ends too, or its writer (the
      // scribe, which owns this stream) would never be released.
      write_paused_ = false;
      net::stream::removed_from_loop(net::operation::write);
    }
    net::stream::removed_from_loop(op);
  }

private:
  logging_tls_policy policy_;
  bool write_paused_ = false;
};

/// A scribe as libcaf_openssl's, with our session and policy and the first-message cap.
class tls_scribe : public caf::io::scribe {
public:
  /// `pending`: its entry until the peer's handshake went through.
  tls_scribe(net::default_multiplexer& mpx, native_socket fd, std::unique_ptr<tls_session> session,
             std::shared_ptr<const caf_port_options> opts, bool outbound,
             std::shared_ptr<pending_handshake> pending)
    : caf::io::scribe(net::conn_hdl_from_socket(fd)), guard_(opts, outbound),
      stream_(mpx, fd, std::move(session), std::move(opts), outbound, &token_, peer_of(fd)),
      token_(std::move(pending)) {
    guard_.watch(&token_);
    // nop
  }

  void hold_until(std::chrono::steady_clock::time_point deadline) { guard_.hold_until(deadline); }

  void configure_read(caf::io::receive_policy::config config) override {
    guard_.hold_in_broker(parent(), hdl());
    stream_.configure_read(guard_.check(config, stream_.fd(), msg().buf));
    if (!launched_) {
      launched_ = true;
      stream_.start(this);
      // Schedules the scribe so that SSL_accept goes on (as CAF's does).
      stream_.force_empty_write(this);
    }
  }

  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = net::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string{};
  }
  uint16_t port() const override {
    auto x = net::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

private:
  handshake_guard guard_;
  bool launched_ = false;
  tls_stream stream_;
  deadline_token token_; // last: goes before the stream closes the socket
};

} // namespace

std::string peer_of(native_socket fd) {
  auto host = net::remote_addr_of_fd(fd);
  auto port = net::remote_port_of_fd(fd);
  if (!host)
    return "an unknown peer";
  auto text = host->find(':') != std::string::npos ? "[" + *host + "]" : *host;
  return port ? text + ":" + std::to_string(*port) : text;
}

caf::io::scribe_ptr make_scribe(net::default_multiplexer& mpx, native_socket fd,
                                const tls_context* tls, std::shared_ptr<const caf_port_options> opts,
                                bool outbound, const std::string& host, const std::string& task,
                                std::shared_ptr<pending_handshake> pending,
                                std::chrono::steady_clock::time_point hold_until) {
  if (tls == nullptr) {
    auto scribe = caf::make_counted<plain_scribe>(mpx, fd, std::move(opts), outbound,
                                                  std::move(pending));
    scribe->hold_until(hold_until);
    return scribe;
  }
  ERR_clear_error();
  auto session = tls_session::make(*tls, fd, outbound ? host : std::string{}, task);
  if (!session)
    return nullptr;
  auto scribe = caf::make_counted<tls_scribe>(mpx, fd, std::move(session), std::move(opts),
                                              outbound, std::move(pending));
  scribe->hold_until(hold_until);
  return scribe;
}

} // namespace caf_port_detail

} // namespace af
