#include "net/caf_port.hpp"
#include "net/caf_port_scribe.hpp"
#include "net/tcp_connect.hpp"
#include "net/tls.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "caf/all.hpp"
#include "caf/io/basp_broker.hpp"
#include "caf/io/middleman.hpp"
#include "caf/io/middleman_actor_impl.hpp"
#include "caf/io/network/default_multiplexer.hpp"
#include "caf/io/network/acceptor.hpp"
#include "caf/io/doorman.hpp"
#include "caf/io/network/native_socket.hpp"

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

namespace net = caf::io::network;
using net::native_socket;
using caf_port_detail::make_scribe;
using caf_port_detail::peer_of;

/// Closes accepted connections of the CAF port whose BASP handshake (the TLS
/// handshake first, with [security]) did not go through within
/// [node] handshake_timeout_ms: a stranger that connects and says nothing,
/// or trickles its handshake, holds a descriptor and a session until then
/// only. A thread of its own looks a few times per deadline; the socket is
/// shut down, and the multiplexer closes the connection as any other.
class handshake_deadline {
public:
  explicit handshake_deadline(std::chrono::milliseconds limit)
    : limit_(limit),
      period_(std::clamp(limit / 4, std::chrono::milliseconds{10}, std::chrono::milliseconds{1000})),
      thread_([this] { run(); }) {}

  handshake_deadline(const handshake_deadline&) = delete;
  handshake_deadline& operator=(const handshake_deadline&) = delete;

  ~handshake_deadline() {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::shared_ptr<pending_handshake> track(native_socket fd) {
    auto p = std::make_shared<pending_handshake>(fd);
    std::lock_guard<std::mutex> guard{mtx_};
    pending_.push_back(p);
    return p;
  }

private:
  void run() {
    std::unique_lock<std::mutex> lock{mtx_};
    while (!stop_) {
      cv_.wait_for(lock, period_);
      if (stop_)
        break;
      auto now = std::chrono::steady_clock::now();
      std::vector<std::string> closed;
      auto end = std::remove_if(pending_.begin(), pending_.end(),
                                [&](const std::weak_ptr<pending_handshake>& w) {
                                  auto p = w.lock();
                                  if (!p)
                                    return true;
                                  std::lock_guard<std::mutex> guard{p->mtx};
                                  if (!p->live)
                                    return true;
                                  if (now - p->since < limit_)
                                    return false;
                                  closed.push_back(peer_of(p->fd));
                                  ::shutdown(p->fd, SHUT_RDWR);
                                  p->live = false;
                                  p->timed_out = true;
                                  return true;
                                });
      pending_.erase(end, pending_.end());
      if (closed.empty())
        continue;
      constexpr size_t named = 3;
      auto more = closed.size() > named ? fmt::format(" and {} more", closed.size() - named) : "";
      closed.resize(std::min(closed.size(), named));
      log::get()->warn("closed {}{} on the CAF port: no handshake within {} ms ([node] "
                       "handshake_timeout_ms; a stranger or a port scan: firewall the port to the "
                       "cluster's hosts; a member that slow: raise it)",
                       fmt::join(closed, ", "), more, limit_.count());
    }
  }

  std::chrono::milliseconds limit_;
  std::chrono::milliseconds period_;
  std::mutex mtx_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::weak_ptr<pending_handshake>> pending_;
  std::thread thread_; // last: starts once the rest is made
};
/// CAF's acceptor (policy::tcp), except out of file descriptors: there CAF
/// leaves the connection in the backlog, the listening socket stays
/// readable, and the multiplexer's thread spins on it for as long as the
/// descriptors stay taken (a full core while 400 idle connections were held
/// against a limit of 200). This one gives up a spare descriptor for a moment
/// to accept the pending connection and close it at once (its peer hears
/// "closed" instead of waiting), then takes the spare again: the data plane's
/// accept loop does the same (data_plane_server::accept_loop,
/// net/data_plane_server.cpp).
class shedding_acceptor : public net::acceptor {
public:
  shedding_acceptor(net::default_multiplexer& mpx, native_socket fd)
    : net::acceptor(mpx, fd), spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
    // nop
  }

  ~shedding_acceptor() override {
    if (spare_ >= 0)
      ::close(spare_);
  }

  void handle_event(net::operation op) override {
    handle_event_impl(op, *this);
  }

  /// The accept policy (handle_event_impl calls it): true with `result` a
  /// new connection, or invalid_native_socket if none was there.
  bool try_accept(native_socket& result, native_socket fd) {
    result = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (result >= 0) {
      if (exhausted_) {
        log::get()->info("CAF port: accepting connections again ({} closed unserved meanwhile)",
                         shed_);
        exhausted_ = false;
        shed_ = 0;
      }
      return true;
    }
    int err = errno;
    result = net::invalid_native_socket;
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED)
      return true;
    if (!exhausted_) {
      log::get()->warn("CAF port: cannot accept connections ({}){}; new ones are closed unserved "
                       "until it can again",
                       std::strerror(err),
                       err == EMFILE || err == ENFILE
                         ? " -- out of file descriptors: raise the limit (ulimit -n, systemd "
                           "LimitNOFILE)"
                         : "");
      exhausted_ = true;
    }
    bool shed = false;
    if (err == EMFILE || err == ENFILE) {
      if (spare_ >= 0) {
        ::close(spare_);
        int victim = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (victim >= 0) {
          ::close(victim);
          ++shed_;
          shed = true;
        }
      }
      spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    // Nothing taken off the backlog (another thread took the freed
    // descriptor, no spare, ENOBUFS, ENOMEM): the socket stays readable and
    // the multiplexer would call again at once. Back off a little instead
    // of burning a core until descriptors or memory come back: 1 ms, since
    // this is the multiplexer's thread, which every CAF connection shares.
    if (!shed)
      std::this_thread::sleep_for(std::chrono::milliseconds{1});
    return false;
  }

private:
  int spare_;
  bool exhausted_ = false; // in a burst of accept failures (logged once)
  uint64_t shed_ = 0;      // connections closed unserved in that burst
};

/// CAF's doorman_impl with a shedding_acceptor, whose new connections get
/// the handshake guard (a deadline, a size bound) and TLS when configured.
class guarded_doorman : public caf::io::doorman {
public:
  guarded_doorman(net::default_multiplexer& mpx, native_socket fd,
                  std::shared_ptr<const caf_port_options> opts,
                  std::shared_ptr<handshake_deadline> deadline)
    : caf::io::doorman(net::accept_hdl_from_socket(fd)), acceptor_(mpx, fd),
      opts_(std::move(opts)), deadline_(std::move(deadline)) {
    // nop
  }

  void graceful_shutdown() override {
    acceptor_.graceful_shutdown();
    detach(&acceptor_.backend(), false);
  }

  void launch() override {
    acceptor_.start(this);
  }

  std::string addr() const override {
    auto x = net::local_addr_of_fd(acceptor_.fd());
    return x ? std::move(*x) : std::string{};
  }

  uint16_t port() const override {
    auto x = net::local_port_of_fd(acceptor_.fd());
    return x ? *x : 0;
  }

  void add_to_loop() override {
    acceptor_.activate(this);
  }

  void remove_from_loop() override {
    acceptor_.passivate();
  }

  bool new_connection() override {
    if (detached())
      return false;
    auto& mpx = acceptor_.backend();
    auto fd = acceptor_.accepted_socket();
    if (opts_->tls)
      net::nonblocking(fd, true);
    auto scribe = make_scribe(mpx, fd, opts_->tls.get(), opts_, false, {}, {}, deadline_->track(fd));
    if (!scribe) {
      // Answering false would stop accepting for good.
      log::get()->error("refused {} on the CAF port: cannot set up TLS ({})", peer_of(fd),
                        tls_errors("out of memory"));
      net::close_socket(fd);
      return true;
    }
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return caf::io::doorman::new_connection(&mpx, hdl);
  }

private:
  shedding_acceptor acceptor_;
  std::shared_ptr<const caf_port_options> opts_;
  // Its thread ends with the doorman; scribes keep only their own entries.
  std::shared_ptr<handshake_deadline> deadline_;
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
    // The doorman's handshake deadline is a thread: under a memory cap it may
    // not start. Say so, instead of an exception that kills this actor and
    // reads as "cannot listen" (a busy port) to the node. Started before the
    // doorman takes the socket, so that the socket has one owner to close it.
    try {
      auto deadline = std::make_shared<handshake_deadline>(opts_->handshake_timeout);
      return caf::make_counted<guarded_doorman>(mpx, *fd, opts_, std::move(deadline));
    } catch (const std::system_error& e) {
      net::close_socket(*fd);
      return make_error(af_error::resource_exhausted,
                        opts_->who + ": out of memory: cannot start the port's handshake thread ("
                          + e.what() + "; or the process's thread limit, ulimit -u); raise the "
                          "memory limit or lower [node] threads");
    } catch (const std::bad_alloc&) {
      net::close_socket(*fd);
      return make_error(af_error::resource_exhausted,
                        opts_->who + ": out of memory opening its port; raise the memory limit");
    }
  }

private:
  std::shared_ptr<const caf_port_options> opts_;
};

/// A TCP connection to `host`:`port` within `timeout`, the name lookup
/// included; the socket, or why not.
caf::expected<native_socket> connect_within(const std::string& host, uint16_t port,
                                            std::chrono::milliseconds timeout) {
  auto fd = tcp_connect(host, port, std::chrono::steady_clock::now() + timeout, timeout,
                        "connect_timeout");
  if (!fd)
    return std::move(fd.error());
  return *fd;
}

} // namespace

caf::expected<opened_connection> connect_scribe(caf::actor_system& sys, const std::string& host,
                                                  uint16_t port, std::chrono::milliseconds timeout,
                                                  const std::shared_ptr<tls_context>& tls,
                                                  const std::string& task) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto fd = connect_within(host, port, timeout);
  if (!fd)
    return std::move(fd.error());
  auto& mpx = static_cast<net::default_multiplexer&>(sys.middleman().backend());
  // After the node's handshake, what BASP itself allows: a session's own
  // limits are checked where it decodes (a node's max_message_bytes is not
  // this process's to apply).
  caf_port_options session_opts;
  session_opts.max_message_bytes = UINT32_MAX;
  auto opts = std::make_shared<const caf_port_options>(std::move(session_opts));
  opened_connection out;
  out.pending = std::make_shared<pending_handshake>(*fd);
  out.scribe = make_scribe(mpx, *fd, tls.get(), std::move(opts), true, host, task, out.pending,
                           deadline);
  if (!out.scribe) {
    ::close(*fd);
    return make_error(af_error::unreachable,
                      "cannot set up TLS for " + host + ": " + tls_errors("out of memory"));
  }
  return out;
}

std::string opened_connection::settle(bool succeeded) {
  std::lock_guard<std::mutex> guard{pending->mtx};
  auto why = std::move(pending->failure);
  // The broker still holds it, waiting for a handshake that may never come
  // (a peer that accepts and says nothing): shut it down, so that the
  // broker drops it and the multiplexer can end (the process hung at exit).
  if (!succeeded && pending->live) {
    ::shutdown(pending->fd, SHUT_RDWR);
    pending->live = false;
    pending->timed_out = true;
  }
  return why;
}

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
