#include "actors/data_plane.hpp"

#include <limits.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "actors/log.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// Writes all of `iov` (partial writes continue where they stopped). A peer
/// that went away is an error here (EPIPE), not a SIGPIPE that ends the process.
bool write_all(int fd, iovec* iov, int count) {
  // sendmsg takes at most IOV_MAX (1024) buffers: a frame of more parts (a
  // push of a model cut into many pieces) goes in several calls, not EMSGSIZE.
#ifdef IOV_MAX
  constexpr int max_iov = IOV_MAX;
#else
  constexpr int max_iov = 1024;
#endif
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(count, max_iov));
    auto n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    auto left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
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
/// wait); false on EOF, error or timeout (errno tells).
bool read_all(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
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
  }
  return true;
}

bool send_frame(int fd, wire::header& h, const std::string* name, const void* payload) {
  iovec iov[3];
  int count = 0;
  iov[count++] = {&h, sizeof(h)};
  if (name != nullptr && !name->empty())
    iov[count++] = {const_cast<char*>(name->data()), name->size()};
  if (h.payload_bytes > 0)
    iov[count++] = {const_cast<void*>(payload), h.payload_bytes};
  return write_all(fd, iov, count);
}

bool send_error(int fd, af_error code, const std::string& text) {
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::reply);
  h.status = static_cast<uint8_t>(code);
  h.payload_bytes = text.size();
  return send_frame(fd, h, nullptr, text.data());
}

/// send_error for a connection that is closing anyway: nothing may throw.
void last_words(int fd, af_error code, const char* node, const char* text) noexcept {
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

skipped skip_payload(int fd, uint64_t bytes, int frame_ms, read_end& how) {
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
  while (!stopping_) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: the pending peer waits in the backlog.
        log::get()->warn("{} data plane: cannot accept a connection ({}); retrying", node_name_,
                         std::strerror(errno));
        pollfd pfd{listen_fd_, 0, 0};
        ::poll(&pfd, 1, 100); // wakes early if stop() shuts the socket down
        continue;
      }
      return; // shut down
    }
    tune_socket(fd);
    // A reader that stops taking our reply must not hold this thread either.
    set_timeout(fd, SO_SNDTIMEO, timeouts_.frame);
    std::vector<std::thread> done;
    try {
      auto peer = peer_address(addr, len);
      std::lock_guard<std::mutex> guard{mtx_};
      if (stopping_) {
        close(fd);
        return;
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
      conns_.push_back(fd);
      try {
        workers_.emplace_back([this, fd, peer] { serve(fd, peer); });
      } catch (...) {
        conns_.pop_back();
        throw;
      }
    } catch (const std::exception& e) {
      // No memory or no thread for one more connection: refuse it, keep serving.
      log::get()->warn("{} data plane: refused a connection: {}", node_name_, e.what());
      close(fd);
    }
    for (auto& t : done)
      t.join();
  }
}

bool data_plane_server::serve_aggregator(int fd, const std::string& peer, const wire::header& h,
                                         const std::string& name) {
  auto frame_ms = static_cast<int>(timeouts_.frame.count());
  bool push = h.kind == static_cast<uint8_t>(wire::kind::push)
              || h.kind == static_cast<uint8_t>(wire::kind::push_params);
  auto agg = dir_->get_aggregator(name);
  auto caller = dir_->aggregator_caller();
  // Checked before anything is allocated: a push for an aggregator that does
  // not exist, or of another size, cannot make the node take its memory.
  std::string refusal;
  af_error code = af_error::invalid_argument;
  if (!agg.actor || !caller) {
    code = af_error::not_found;
    refusal = fmt::format("no aggregator '{}' on {}; the chief creates it when the job starts",
                          name, node_name_);
  } else if (h.has_tensor
             && (!push || static_cast<dtype>(h.dtype) != dtype::float32 || h.rank != 1
                 || static_cast<uint64_t>(h.dims[0]) != agg.floats)) {
    code = af_error::shape_mismatch;
    refusal = fmt::format("{} to aggregator '{}': {}{} values, expected float32[{}]",
                          push ? "push" : "pull", name, dtype_name(static_cast<dtype>(h.dtype)),
                          shape_string(wire::shape_of(h)), agg.floats);
  } else if (!h.has_tensor && h.payload_bytes > 0) {
    refusal = "a push or pull with a payload that is no tensor";
  }
  if (!refusal.empty()) {
    read_end how = read_end::done;
    switch (skip_payload(fd, h.payload_bytes, frame_ms, how)) {
      case skipped::lost:
        return false;
      case skipped::too_large:
        send_error(fd, code, refusal + " (the connection is closed: its payload was not read)");
        return false;
      case skipped::past:
        return send_error(fd, code, refusal);
    }
  }
  tensor values;
  if (h.has_tensor) {
    try {
      values.reset(dtype::float32, wire::shape_of(h));
    } catch (const std::bad_alloc&) {
      send_error(fd, af_error::resource_exhausted,
                 fmt::format("{} cannot allocate {} bytes for a push to '{}' (out of memory)",
                             node_name_, h.payload_bytes, name));
      return false;
    }
    if (h.payload_bytes > 0
        && read_timed(fd, values.mutable_bytes(), h.payload_bytes, frame_ms, frame_ms, false)
             != read_end::done) {
      log::get()->warn("{} data plane: dropped {}: it stopped in the middle of a push to '{}'",
                       node_name_, peer, name);
      return false;
    }
  }
  auto r = caller(agg.actor, h.kind, h.reserved, h.version, std::move(values), agg.wait);
  if (!r)
    return send_error(fd, wire_code(r.error()), describe(r.error()));
  wire::header reply;
  reply.kind = static_cast<uint8_t>(wire::kind::reply);
  reply.version = r->first;
  const auto& params = r->second;
  if (!params.empty())
    wire::describe_tensor(params, reply); // rank 1
  return send_frame(fd, reply, nullptr, params.empty() ? nullptr : params.bytes());
}

void data_plane_server::serve(int fd, const std::string& peer) {
  auto idle_ms = static_cast<int>(timeouts_.idle.count());
  auto frame_ms = static_cast<int>(timeouts_.frame.count());
  // True if a read ended the connection; says why in the log if the peer went silent.
  auto ended = [&](read_end how, const char* where) -> bool {
    if (how == read_end::idle)
      log::get()->info("{} data plane: closed the connection of {}: idle for {} ms", node_name_,
                       peer, idle_ms);
    else if (how == read_end::stalled)
      log::get()->warn("{} data plane: dropped {}: it stopped sending in the middle of a frame's {} "
                       "for {} ms",
                       node_name_, peer, where, frame_ms);
    return how != read_end::done;
  };
  try {
    std::string name;
    wire::header h;
    for (;;) {
      if (ended(read_timed(fd, &h, sizeof(h), idle_ms, frame_ms, true), "header"))
        break;
      auto problem = wire::validate(h);
      if (problem.empty() && !valid_var_op(h.kind) && !wire::aggregator_kind(h.kind))
        problem = "a reply frame sent as a request";
      if (!problem.empty()) {
        // The stream cannot be trusted past a bad header: answer and hang up.
        log::get()->warn("{} data plane: refused {}: {}", node_name_, peer, problem);
        send_error(fd, af_error::invalid_argument, node_name_ + " data plane: " + problem);
        break;
      }
      name.resize(h.name_len);
      if (h.name_len > 0 && ended(read_timed(fd, name.data(), name.size(), frame_ms, frame_ms, false),
                                  "variable name"))
        break;
      if (wire::aggregator_kind(h.kind)) {
        if (!serve_aggregator(fd, peer, h, name))
          break;
        continue;
      }
      // The variable and the operand's fit are checked before anything is
      // allocated for the operand: a frame for a variable that does not exist,
      // or of another shape, cannot make the node take its memory.
      auto found = dir_->get(name);
      std::string refusal;
      af_error refusal_code = af_error::not_found;
      if (!found.cell) {
        refusal = "no variable '" + name + "' on " + node_name_;
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
      if (!refusal.empty() || (!h.has_tensor && h.payload_bytes > 0)) {
        // Skip the payload through a small buffer, still under the frame timeout.
        read_end how = read_end::done;
        auto skip = skip_payload(fd, h.payload_bytes, frame_ms, how);
        if (skip == skipped::lost) {
          ended(how, "payload");
          break;
        }
        if (skip == skipped::too_large) {
          send_error(fd, refusal.empty() ? af_error::invalid_argument : refusal_code,
                     (refusal.empty() ? std::string{"a payload that is no tensor"} : refusal)
                       + " (the connection is closed: its payload was not read)");
          break;
        }
        if (!refusal.empty()) {
          if (!send_error(fd, refusal_code, refusal))
            break;
          continue;
        }
      }
      tensor operand;
      if (h.has_tensor) {
        try {
          operand.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
        } catch (const std::bad_alloc&) {
          log::get()->warn("{} data plane: no memory for {} bytes of '{}' from {}", node_name_,
                           h.payload_bytes, name, peer);
          send_error(fd, af_error::resource_exhausted,
                     fmt::format("{} cannot allocate {} bytes for the operand of '{}' (out of memory)",
                                 node_name_, h.payload_bytes, name));
          break; // the payload is still in the stream
        }
        if (h.payload_bytes > 0
            && ended(read_timed(fd, operand.mutable_bytes(), h.payload_bytes, frame_ms, frame_ms, false),
                     "payload"))
          break;
      }
      // Applied right here under the cell's lock: no actor hop.
      auto r = found.cell->apply(static_cast<var_op>(h.kind), operand, h.want_value != 0);
      if (!r) {
        if (!send_error(fd, wire_code(r.error()), describe(r.error())))
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
        if (!send_error(fd, af_error::invalid_argument,
                        "variable '" + name + "' has rank " + std::to_string(value.shape().size())
                          + "; the data plane carries rank <= 8"))
          break;
        continue;
      }
      // Straight from the variable's buffer: `value` shares it, no copy.
      if (!send_frame(fd, reply, nullptr, value.empty() ? nullptr : value.bytes())) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
          log::get()->warn("{} data plane: dropped {}: it took nothing of its reply for {} ms",
                           node_name_, peer, frame_ms);
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    log::get()->warn("{} data plane: out of memory serving {}; closed its connection", node_name_, peer);
    last_words(fd, af_error::resource_exhausted, node_name_.c_str(), "out of memory");
  } catch (const std::exception& e) {
    log::get()->error("{} data plane: closed the connection of {}: {}", node_name_, peer, e.what());
    last_words(fd, af_error::internal, node_name_.c_str(), e.what());
  }
  std::lock_guard<std::mutex> guard{mtx_};
  conns_.erase(std::remove(conns_.begin(), conns_.end(), fd), conns_.end());
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
                      std::shared_ptr<tls_context> tls) {
  (void) tls;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  auto rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    return make_error(af_error::unreachable,
                      "cannot resolve " + host + " for the data plane of " + peer + ": " + gai_strerror(rc));
  int fd = -1;
  std::string why = "no address";
  for (auto* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
      continue;
    // Bound the connect, the sends and the receives by the session's timeout.
    set_timeout(fd, SO_SNDTIMEO, timeout);
    set_timeout(fd, SO_RCVTIMEO, timeout);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    return make_error(af_error::unreachable, "cannot open the data plane of " + peer + " at " + host
                                               + ":" + std::to_string(port) + ": " + why);
  tune_socket(fd);
  return std::unique_ptr<data_channel>{new data_channel(fd, host, port, std::move(peer), timeout, poll)};
}

void data_channel::reopen_if_closed_by_peer() {
  // The node drops connections idle for data_idle_timeout_ms (minutes). A
  // channel that has been quiet for a while checks for that EOF before
  // sending, so that the next op goes on a fresh connection instead of
  // failing. Back-to-back ops skip the check (a syscall each).
  if (fd_ < 0 || std::chrono::steady_clock::now() - last_reply_ < std::chrono::milliseconds{100})
    return;
  char byte;
  auto r = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
    return; // open (bytes without a request would be the peer's problem to report)
  reconnect(); // if it fails, the send fails and says why
}

bool data_channel::reconnect() {
  auto fresh = connect(host_, port_, peer_, timeout_, poll_);
  if (!fresh)
    return false;
  if (fd_ >= 0)
    close(fd_);
  fd_ = (*fresh)->fd_;
  (*fresh)->fd_ = -1;
  return true;
}

void data_channel::poll_for_reply() {
  // A small op's reply comes back within tens of microseconds. Sleeping in
  // recv costs a wake-up, and on a small VM a wake-up across CPUs costs
  // ~20 us (measured: 58 us round trips instead of ~20 us): look for the
  // reply for a moment first, then block.
  if (poll_.count() <= 0)
    return;
  auto until = std::chrono::steady_clock::now() + poll_;
  char byte;
  do {
    if (::recv(fd_, &byte, 1, MSG_DONTWAIT | MSG_PEEK) != -1 || errno != EAGAIN)
      return; // data, EOF or an error: read_all takes it from here
  } while (std::chrono::steady_clock::now() < until);
}

data_channel::~data_channel() {
  if (fd_ >= 0)
    close(fd_);
}

caf::error data_channel::fail(const std::string& what, int err) {
  close(fd_);
  fd_ = -1;
  if (err == EAGAIN || err == EWOULDBLOCK)
    return make_error(af_error::timeout, "timed out after " + std::to_string(timeout_.count())
                                           + " ms waiting for " + peer_ + " to answer " + what
                                           + "; is the node alive and reachable?");
  return make_error(af_error::peer_down, peer_ + " closed the data connection during " + what + " ("
                                           + std::strerror(err) + "); did the node stop or die?");
}

caf::expected<std::pair<tensor, uint64_t>>
data_channel::call(var_op op, const std::string& var, const tensor* operand, bool want_value) {
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
  if (operand != nullptr && !wire::describe_tensor(*operand, h))
    return make_error(af_error::invalid_argument,
                      what + ": rank " + std::to_string(operand->shape().size())
                        + " is more than the data plane carries (8)");
  for (int attempt = 0;; ++attempt) {
    bool retry = attempt == 0 && quiet && op == var_op::read;
    if (!send_frame(fd_, h, &var, operand ? operand->bytes() : nullptr)) {
      auto err = fail(what, errno);
      if (retry && reconnect())
        continue;
      return err;
    }
    auto r = read_reply(what);
    if (!r && retry && fd_ < 0 && r.error().category() == error_category
        && r.error().code() == static_cast<uint8_t>(af_error::peer_down) && reconnect())
      continue;
    return r;
  }
}

caf::expected<std::pair<tensor, uint64_t>> data_channel::read_reply(const std::string& what) {
  wire::header r;
  poll_for_reply();
  if (cancel_) {
    // Wait for the reply in slices, so that a cancel is seen within 20 ms;
    // the timeout is the same as read_all's.
    auto until = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      pollfd pfd{fd_, POLLIN, 0};
      int rc = ::poll(&pfd, 1, 20);
      // EINTR is the Ctrl-C itself (its handler sets the flag checked below).
      if (rc > 0 || (rc < 0 && errno != EINTR))
        break;
      if (std::chrono::steady_clock::now() >= until)
        return fail(what, EAGAIN);
      if (cancel_->load()) {
        close(fd_);
        fd_ = -1;
        return make_error(af_error::cancelled, what + " on " + peer_
                                                 + " was abandoned; the connection is opened "
                                                   "again for the next call");
      }
    }
  }
  if (!read_all(fd_, &r, sizeof(r)))
    return fail(what, errno);
  auto problem = wire::validate(r);
  if (problem.empty() && r.kind != static_cast<uint8_t>(wire::kind::reply))
    problem = "a request frame sent as a reply";
  if (!problem.empty()) {
    close(fd_);
    fd_ = -1;
    return make_error(af_error::internal, peer_ + " sent a bad data-plane frame: " + problem);
  }
  if (r.status != 0) {
    if (!valid_af_error(r.status)) {
      // Not one of our codes: a peer of another version, or not ours at all.
      close(fd_);
      fd_ = -1;
      return make_error(af_error::internal,
                        fmt::format("data plane of {}: peer sent an invalid status byte {} in reply "
                                    "to {}",
                                    peer_, static_cast<unsigned>(r.status), what));
    }
    std::string text(r.payload_bytes, '\0');
    if (!read_all(fd_, text.data(), text.size()))
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
      close(fd_); // the payload is still in the stream
      fd_ = -1;
      return make_error(af_error::resource_exhausted, what + ": cannot allocate "
                                                        + std::to_string(r.payload_bytes)
                                                        + " bytes for the reply (out of memory)");
    }
    if (r.payload_bytes > 0 && !read_all(fd_, value.mutable_bytes(), r.payload_bytes))
      return fail(what, errno);
  }
  last_reply_ = std::chrono::steady_clock::now();
  return std::make_pair(std::move(value), r.version);
}

caf::expected<std::pair<uint64_t, tensor>>
data_channel::aggregate(wire::kind kind, const std::string& name, uint32_t worker, uint64_t step,
                        const std::vector<tensor>& values, std::chrono::milliseconds wait) {
  bool push = kind == wire::kind::push || kind == wire::kind::push_params;
  auto what = fmt::format("{} of worker {} to aggregator '{}'", push ? "push" : "pull", worker, name);
  if (!wire::aggregator_kind(static_cast<uint8_t>(kind)))
    return make_error(af_error::invalid_argument, what + ": not a push or pull frame");
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  if (name.size() > wire::max_name || worker > UINT16_MAX)
    return make_error(af_error::invalid_argument, what + ": name or worker index too large");
  reopen_if_closed_by_peer();
  wire::header h;
  h.kind = static_cast<uint8_t>(kind);
  h.name_len = static_cast<uint32_t>(name.size());
  h.version = step;
  h.reserved = static_cast<uint16_t>(worker);
  std::vector<iovec> iov;
  iov.reserve(values.size() + 2);
  iov.push_back({&h, sizeof(h)});
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
  bool sent = write_all(fd_, iov.data(), static_cast<int>(iov.size()));
  if (!sent)
    return fail(what, errno);
  auto r = read_reply(what);
  if (fd_ >= 0)
    set_timeout(fd_, SO_RCVTIMEO, timeout_);
  if (!r)
    return std::move(r.error());
  return std::make_pair(r->second, std::move(r->first));
}

} // namespace af
