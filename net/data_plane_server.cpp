/// The data plane's server: listening, accepting and admitting connections
/// (under the node's limits), each connection's TLS handshake, and the
/// frame loop that takes the offers of shared memory and UCX
/// (net/data_plane_offers.cpp) and hands every other request to the node's
/// plane_handler (net/plane_handler.hpp).
#include "net/data_plane.hpp"
#include "net/data_link.hpp"
#include "net/served_connection.hpp"
#include "net/socket.hpp"
#include "net/tls_io.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

using namespace plane_io;

// -- data_plane_server ---------------------------------------------------------

caf::expected<std::unique_ptr<data_plane_server>>
data_plane_server::start(std::shared_ptr<plane_handler> handler, const std::string& bind_host,
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
    new data_plane_server(std::move(handler), node_name, timeouts, std::move(tls))};
  auto l = sock::listen_tcp(bind_host, port, 64, [](int fd) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  if (!l.resolved)
    return make_error(af_error::bind_failed, node_name + ": cannot resolve '" + bind_host
                                               + "' for the data plane: " + l.why);
  const std::string& why = l.why;
  srv->listen_fd_ = l.fd;
  srv->port_ = l.port;
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
    sock::set_nodelay(fd);
    // A reader that stops taking our reply must not hold this thread either.
    set_timeout(fd, SO_SNDTIMEO, timeouts_.frame);
    // Over TLS, the record layer's waits inside a frame are bounded by the socket.
    if (tls_)
      set_timeout(fd, SO_RCVTIMEO, timeouts_.frame);
    std::vector<std::thread> done;
    try {
      if (!admit(fd, peer_address(addr, len), done, over_limit, over_handshakes))
        break;
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

bool data_plane_server::admit(int fd, const std::string& peer, std::vector<std::thread>& done,
                              uint64_t& over_limit, uint64_t& over_handshakes) {
  std::unique_lock<std::mutex> guard{mtx_};
  if (stopping_) {
    close(fd);
    return false;
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
    counters_.count_refusal(plane_refusal::max_connections);
    if (over_limit++ == 0)
      log::get()->warn("{} data plane: refused {}: {} connections are open, the most it serves "
                       "([node] max_data_connections = {}); further refusals are counted",
                       node_name_, peer, open_now, timeouts_.max_connections);
    if (!tls_)
      last_words(link{fd}, af_error::resource_exhausted, node_name_.c_str(),
                 fmt::format("{} connections are open, the most this node serves ([node] "
                             "max_data_connections = {}); try again when one has closed",
                             open_now, timeouts_.max_connections)
                   .c_str());
    close_refused(fd);
    return true;
  }
  if (tls_) {
    // A stranger's connection holds a slot (and a thread) until its
    // handshake fails, up to one frame timeout: a few per host at once.
    auto& pending = handshaking_[host_of(peer)];
    if (pending >= max_handshakes_per_host) {
      guard.unlock();
      counters_.count_refusal(plane_refusal::handshakes);
      if (over_handshakes++ == 0)
        log::get()->warn("{} data plane: refused {}: {} connections from its host are still in "
                         "their TLS handshake; further refusals are counted",
                         node_name_, peer, pending);
      close_refused(fd);
      return true;
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
  counters_.open.store(static_cast<int64_t>(conns_.size()), std::memory_order_relaxed);
  try {
    workers_.emplace_back([this, fd, peer] { serve(fd, peer); });
    counters_.accepted.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    conns_.pop_back();
    counters_.open.store(static_cast<int64_t>(conns_.size()), std::memory_order_relaxed);
    if (tls_) {
      auto it = handshaking_.find(host_of(peer));
      if (it != handshaking_.end() && --it->second <= 0)
        handshaking_.erase(it);
    }
    throw;
  }
  return true;
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
    last_words(link{fd}, af_error::invalid_config, node_name_.c_str(),
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
  tls_failure kind = tls_failure::none;
  auto why = tls_handshake(ssl, fd, true, std::max(left, std::chrono::milliseconds{1}), &kind);
  if (kind == tls_failure::timeout) // say the whole limit, not what was left
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
    counters_.count_refusal(plane_refusal::tls);
    std::lock_guard<std::mutex> guard{mtx_};
    conns_.erase(std::remove(conns_.begin(), conns_.end(), fd), conns_.end());
    counters_.open.store(static_cast<int64_t>(conns_.size()), std::memory_order_relaxed);
    close_refused(fd);
    try {
      finished_.push_back(std::this_thread::get_id());
    } catch (const std::bad_alloc&) {
      // nop: stop() joins this thread instead
    }
    return;
  }
  try {
    // (Its byte channel is allocated: a read-ahead buffer, or TLS's.)
    served_connection c{shm_mapped_, node_name_, peer, fd, stream.get(),
                        static_cast<int>(timeouts_.idle.count()),
                        static_cast<int>(timeouts_.frame.count())};
    c.io.stall_ms = c.frame_ms;
    c.io.spin = timeouts_.spin;
    c.server_stopping = &stopping_;
    try {
      serve_frames(c);
    } catch (const std::bad_alloc&) {
      log::get()->warn("{} data plane: out of memory serving {}; closed its connection", node_name_,
                       peer);
      last_words(c.io, af_error::resource_exhausted, node_name_.c_str(), "out of memory");
    } catch (const std::exception& e) {
      log::get()->error("{} data plane: closed the connection of {}: {}", node_name_, peer,
                        e.what());
      last_words(c.io, af_error::internal, node_name_.c_str(), e.what());
    }
  } catch (const std::bad_alloc&) {
    log::get()->warn("{} data plane: out of memory for the connection of {}; closed it unserved",
                     node_name_, peer);
  }
  std::lock_guard<std::mutex> guard{mtx_};
  conns_.erase(std::remove(conns_.begin(), conns_.end(), fd), conns_.end());
  counters_.open.store(static_cast<int64_t>(conns_.size()), std::memory_order_relaxed);
  stream.reset(); // no close_notify: the peer sees the socket close, as in plaintext
  close(fd);
  try {
    finished_.push_back(std::this_thread::get_id());
  } catch (const std::bad_alloc&) {
    // nop: stop() joins this thread instead
  }
}

void data_plane_server::serve_frames(served_connection& c) {
  auto& io = c.io;
  const auto& peer = c.peer;
  auto idle_ms = c.idle_ms;
  auto frame_ms = c.frame_ms;
  std::string name;
  wire::header h;
  for (;;) {
    if (c.ended(read_timed(io, &h, sizeof(h), idle_ms, frame_ms, true), "header"))
      break;
    auto problem = wire::validate(h);
    bool offer = h.kind == static_cast<uint8_t>(wire::kind::shm_offer);
    bool edge = h.kind == static_cast<uint8_t>(wire::kind::edge);
    bool ucx_offer = h.kind == static_cast<uint8_t>(wire::kind::ucx_offer);
    bool gather = h.kind == static_cast<uint8_t>(wire::kind::gather_rows);
    bool many = h.kind == static_cast<uint8_t>(wire::kind::gather_many);
    bool pad = h.kind == static_cast<uint8_t>(wire::kind::shm_pad);
    if (problem.empty() && !valid_var_op(h.kind) && !wire::aggregator_kind(h.kind) && !offer
        && !edge && !ucx_offer && !gather && !many && !pad)
      problem = "a reply frame sent as a request";
    if (pad && (h.payload_bytes >= shm_channel::payload_alignment || h.has_tensor
                || h.name_len != 0))
      problem = fmt::format("padding of {} bytes with a tensor or a name: not one of actorflow's",
                            h.payload_bytes);
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
      counters_.count_refusal(plane_refusal::bad_frame);
      send_error(io, af_error::invalid_argument, node_name_ + " data plane: " + problem);
      break;
    }
    if (pad) {
      // Skipped, unanswered: the next frame's payload starts aligned in
      // the ring, for its reader to use in place (plane_request::payload_in_place).
      char skip[shm_channel::payload_alignment];
      if (h.payload_bytes > 0
          && c.ended(read_timed(io, skip, h.payload_bytes, frame_ms, frame_ms, false), "padding"))
        break;
      continue;
    }
    name.resize(h.name_len);
    if (h.name_len > 0 && c.ended(read_timed(io, name.data(), name.size(), frame_ms, frame_ms, false),
                                "variable name"))
      break;
    if (ucx_offer) {
      if (!serve_ucx_offer(c, h))
        break;
      continue;
    }
    if (offer) {
      if (!serve_shm_offer(c, h, name))
        break;
      continue;
    }
    // Counted where the frame came (relaxed increments: no lock), its
    // reply by plane_request::reply.
    auto& counted = counters_.of(c.ucx   ? plane_transport::ucx
                                 : c.shm ? plane_transport::shm
                                 : c.tls ? plane_transport::tls
                                         : plane_transport::tcp);
    c.counted = &counted;
    counted.requests.fetch_add(1, std::memory_order_relaxed);
    counted.bytes_received.fetch_add(sizeof(h) + h.name_len + h.payload_bytes,
                                     std::memory_order_relaxed);
    if (gather || many || valid_var_op(h.kind))
      counted.variable_ops.fetch_add(1, std::memory_order_relaxed);
    // The rest is the runtime's: one virtual call per frame.
    plane_request req{c, h, name, timeouts_};
    bool go_on = wire::aggregator_kind(h.kind) ? handler_->aggregate(req)
                 : edge                        ? handler_->edge(req)
                 : gather                      ? handler_->gather_rows(req)
                 : many                        ? handler_->gather_many(req)
                                               : handler_->variable_op(req);
    if (!go_on || !c.take_back_lent())
      break;
  }
}

bool served_connection::ended(read_end how, const char* where) const {
  if (how == read_end::idle)
    log::get()->info("{} data plane: closed the connection of {}: idle for {} ms", node_name,
                     peer, idle_ms);
  else if (how == read_end::stalled)
    log::get()->warn("{} data plane: dropped {}: it stopped sending in the middle of a frame's {} "
                     "for {} ms",
                     node_name, peer, where, frame_ms);
  else if (how == read_end::failed && !last_tls_error.empty())
    log::get()->warn("{} data plane: closed the connection of {} (reading a frame's {}): {}",
                     node_name, peer, where, std::exchange(last_tls_error, {}));
  else if ((how == read_end::closed || how == read_end::failed) && std::strcmp(where, "header") != 0
           && (server_stopping == nullptr || !server_stopping->load()))
    // Between frames a hang-up is how a client leaves; within one (its
    // header read, its name or payload not), the request is dropped: said,
    // unless this node's stop shut the connection down.
    log::get()->info("{} data plane: {} hung up in the middle of a frame's {} ({}); the "
                     "request is dropped",
                     node_name, peer, where,
                     how == read_end::closed ? "it closed the connection" : "a socket error");
  return how != read_end::done;
}

} // namespace af
