#include "actors/caf_port.hpp"
#include "actors/tls.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <memory>
#include <utility>

#include <openssl/err.h>

#include "caf/all.hpp"
#include "caf/io/basp/header.hpp"
#include "caf/io/basp/message_type.hpp"
#include "caf/io/basp_broker.hpp"
#include "caf/io/middleman.hpp"
#include "caf/io/middleman_actor_impl.hpp"
#include "caf/io/network/default_multiplexer.hpp"
#include "caf/io/network/doorman_impl.hpp"
#include "caf/io/network/native_socket.hpp"
#include "caf/io/network/scribe_impl.hpp"
#include "caf/io/network/stream_impl.hpp"
#include "caf/openssl/session.hpp"

#include "actors/log.hpp"

namespace af {

namespace {

namespace net = caf::io::network;
using net::native_socket;
using net::rw_state;

std::string peer_of(native_socket fd) {
  auto host = net::remote_addr_of_fd(fd);
  auto port = net::remote_port_of_fd(fd);
  if (!host)
    return "an unknown peer";
  auto text = host->find(':') != std::string::npos ? "[" + *host + "]" : *host;
  return port ? text + ":" + std::to_string(*port) : text;
}

/// The pre-handshake cap, shared by the plaintext and the TLS scribe. BASP
/// asks its scribe for a header, then for the payload the header announced;
/// CAF 0.17.6 does not refuse other messages (a heartbeat) before the client's
/// handshake. So every read is capped until the broker has taken the payload
/// of a client_handshake (told by the header it just got, byte 0); from then
/// on the broker's own checks and [node] max_message_bytes apply.
class handshake_guard {
public:
  explicit handshake_guard(std::shared_ptr<const caf_port_options> opts) : opts_(std::move(opts)) {}

  /// The read to configure instead of `config`: itself, or one byte after
  /// the socket was shut down (the broker then sees an ordinary close).
  /// `delivered` is what the broker was just handed (the scribe's message).
  caf::io::receive_policy::config check(caf::io::receive_policy::config config, native_socket fd,
                                        const std::vector<char>& delivered) {
    if (refused_)
      return {caf::io::receive_policy_flag::exactly, 1};
    if (handshake_payload_next_)
      done_ = true; // the client's handshake went through the broker
    if (done_) {
      if (config.second <= opts_->max_message_bytes)
        return config;
      log::get()->warn("closed the CAF connection of {}: it announces a message of {} bytes (at "
                       "most {}, [node] max_message_bytes)",
                       peer_of(fd), config.second, opts_->max_message_bytes);
      return refuse(fd);
    }
    if (delivered.size() == caf::io::basp::header_size
        && static_cast<uint8_t>(delivered[0])
             == static_cast<uint8_t>(caf::io::basp::message_type::client_handshake))
      handshake_payload_next_ = true;
    if (config.second <= opts_->max_handshake_bytes)
      return config;
    log::get()->warn("refused {} on the CAF port: it announces a message of {} bytes before its "
                     "handshake (at most {}, [node] max_handshake_bytes); closed unread",
                     peer_of(fd), config.second, opts_->max_handshake_bytes);
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
  bool handshake_payload_next_ = false;
  bool done_ = false;
  bool refused_ = false;
};

class plain_scribe : public net::scribe_impl {
public:
  plain_scribe(net::default_multiplexer& mpx, native_socket fd,
               std::shared_ptr<const caf_port_options> opts)
    : net::scribe_impl(mpx, fd), guard_(std::move(opts)) {
    // nop
  }

  void configure_read(caf::io::receive_policy::config config) override {
    net::scribe_impl::configure_read(guard_.check(config, stream_.fd(), msg().buf));
  }

private:
  handshake_guard guard_;
};

/// CAF's openssl::session as the stream's protocol, which says who failed the
/// TLS handshake and why (CAF's own policy drops OpenSSL's reason).
class logging_tls_policy {
public:
  logging_tls_policy(caf::openssl::session_ptr session,
                     std::shared_ptr<const caf_port_options> opts)
    : session_(std::move(session)), opts_(std::move(opts)) {
    // nop
  }

  rw_state read_some(size_t& result, native_socket fd, void* buf, size_t len) {
    auto st = session_->read_some(result, fd, buf, len);
    if (st == rw_state::success && result > 0)
      established_ = true;
    else if (st == rw_state::failure)
      refused(fd);
    return st;
  }

  rw_state write_some(size_t& result, native_socket fd, const void* buf, size_t len) {
    auto st = session_->write_some(result, fd, buf, len);
    // SSL_write succeeds only once the handshake is done (the node writes
    // BASP's server handshake first): a peer that leaves after it was not refused.
    if (st == rw_state::success && result > 0)
      established_ = true;
    else if (st == rw_state::failure)
      refused(fd);
    return st;
  }

  bool must_read_more(native_socket fd, size_t threshold) {
    return session_->must_read_more(fd, threshold);
  }

private:
  void refused(native_socket fd) {
    if (established_ || reported_) {
      ERR_clear_error();
      return;
    }
    reported_ = true;
    auto why = tls_errors("the connection closed during the TLS handshake");
    log::get()->warn("refused {} on the CAF port: TLS handshake failed ({}); a peer needs a "
                     "certificate of the cluster CA",
                     peer_of(fd), why);
  }

  caf::openssl::session_ptr session_;
  std::shared_ptr<const caf_port_options> opts_;
  bool established_ = false;
  bool reported_ = false;
};

/// libcaf_openssl's scribe with our policy and the first-message cap.
class tls_scribe : public caf::io::scribe {
public:
  tls_scribe(net::default_multiplexer& mpx, native_socket fd, caf::openssl::session_ptr session,
             std::shared_ptr<const caf_port_options> opts)
    : caf::io::scribe(net::conn_hdl_from_socket(fd)), guard_(opts),
      stream_(mpx, fd, std::move(session), std::move(opts)) {
    // nop
  }

  void configure_read(caf::io::receive_policy::config config) override {
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
  net::stream_impl<logging_tls_policy> stream_;
};

class guarded_doorman : public net::doorman_impl {
public:
  guarded_doorman(net::default_multiplexer& mpx, native_socket fd,
                  std::shared_ptr<const caf_port_options> opts)
    : net::doorman_impl(mpx, fd), opts_(std::move(opts)) {
    // nop
  }

  bool new_connection() override {
    if (detached())
      return false;
    auto& mpx = acceptor_.backend();
    auto fd = acceptor_.accepted_socket();
    caf::io::scribe_ptr scribe;
    if (opts_->tls) {
      net::nonblocking(fd, true);
      ERR_clear_error();
      // CAF loads the files again for each connection and throws if they
      // no longer load (a rotated key): refuse that one, keep serving.
      caf::openssl::session_ptr session;
      errno = 0;
      try {
        session = caf::openssl::make_session(parent()->system(), fd, true);
      } catch (const std::exception& e) {
        if (errno == EMFILE || errno == ENFILE)
          log::get()->error("refused {} on the CAF port: cannot set up TLS ({}): out of file "
                            "descriptors; raise the limit (ulimit -n, systemd LimitNOFILE)",
                            peer_of(fd), e.what());
        else
          log::get()->error("refused {} on the CAF port: cannot set up TLS ({}); are the "
                            "[security] files still readable and matching?",
                            peer_of(fd), e.what());
        net::close_socket(fd);
        return true;
      }
      if (!session) {
        // The handshake failed at once (bytes that are no TLS were already
        // there). CAF's doorman answers false here, which stops accepting.
        log::get()->warn("refused {} on the CAF port: TLS handshake failed ({})", peer_of(fd),
                         tls_errors("no TLS session"));
        net::close_socket(fd);
        return true;
      }
      scribe = caf::make_counted<tls_scribe>(mpx, fd, std::move(session), opts_);
    } else {
      scribe = caf::make_counted<plain_scribe>(mpx, fd, opts_);
    }
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return caf::io::doorman::new_connection(&mpx, hdl);
  }

private:
  std::shared_ptr<const caf_port_options> opts_;
};

class guarded_middleman : public caf::io::middleman_actor_impl {
public:
  guarded_middleman(caf::actor_config& cfg, caf::actor broker,
                    std::shared_ptr<const caf_port_options> opts)
    : caf::io::middleman_actor_impl(cfg, std::move(broker)), opts_(std::move(opts)) {
    // nop
  }

  const char* name() const override { return "af.guarded_middleman"; }

protected:
  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr, bool reuse) override {
    auto fd = net::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd)
      return std::move(fd.error());
    auto& mpx = static_cast<net::default_multiplexer&>(system().middleman().backend());
    return caf::make_counted<guarded_doorman>(mpx, *fd, opts_);
  }

private:
  std::shared_ptr<const caf_port_options> opts_;
};

} // namespace

caf::actor spawn_guarded_middleman(caf::actor_system& sys, caf_port_options opts) {
  auto shared = std::make_shared<const caf_port_options>(std::move(opts));
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  return caf::actor_cast<caf::actor>(
    sys.spawn<guarded_middleman, caf::hidden>(std::move(broker), std::move(shared)));
}

caf::expected<uint16_t> publish_guarded(caf::actor_system& sys, const caf::actor& mm,
                                        caf::strong_actor_ptr whom, std::set<std::string> sigs,
                                        uint16_t port, const std::string& host) {
  caf::expected<uint16_t> out{caf::sec::cannot_open_port};
  caf::scoped_actor self{sys, true};
  // The middleman actor is local: it answers at once unless bind() hangs.
  self->request(mm, std::chrono::seconds{30}, caf::publish_atom::value, port, std::move(whom), std::move(sigs),
                host, true)
    .receive([&](uint16_t bound) { out = bound; }, [&](caf::error& err) { out = std::move(err); });
  return out;
}

} // namespace af
