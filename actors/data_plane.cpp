#include "actors/data_plane.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "caf/all.hpp"

#include "actors/variable.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

/// Requests from a connection to a variable actor of the same node.
constexpr auto variable_timeout = std::chrono::seconds(60);

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// Writes all of `iov` (partial writes continue where they stopped).
bool write_all(int fd, iovec* iov, int count) {
  while (count > 0) {
    auto n = ::writev(fd, iov, count);
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

/// Reads exactly `n` bytes; false on EOF, error or timeout (errno tells).
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

const char* op_name(wire::kind k) {
  switch (k) {
    case wire::kind::read: return "read";
    case wire::kind::assign: return "assign";
    case wire::kind::assign_add: return "assign_add";
    case wire::kind::assign_sub: return "assign_sub";
    default: return "reply";
  }
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

// -- data_plane_server ---------------------------------------------------------

caf::expected<std::unique_ptr<data_plane_server>>
data_plane_server::start(caf::actor_system& sys, std::shared_ptr<variable_directory> dir,
                         const std::string& bind_host, uint16_t port, std::string node_name) {
  std::unique_ptr<data_plane_server> srv{new data_plane_server(sys, std::move(dir), node_name)};
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
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      return; // shut down
    }
    tune_socket(fd);
    std::vector<std::thread> done;
    {
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
      workers_.emplace_back([this, fd] { serve(fd); });
    }
    for (auto& t : done)
      t.join();
  }
}

void data_plane_server::serve(int fd) {
  caf::scoped_actor self{sys_, true};
  std::string name;
  wire::header h;
  while (read_all(fd, &h, sizeof(h))) {
    auto problem = wire::validate(h);
    if (problem.empty() && h.kind == static_cast<uint8_t>(wire::kind::reply))
      problem = "a reply frame sent as a request";
    if (!problem.empty()) {
      // The stream cannot be trusted past a bad header: answer and hang up.
      send_error(fd, af_error::invalid_argument, node_name_ + " data plane: " + problem);
      break;
    }
    name.resize(h.name_len);
    if (h.name_len > 0 && !read_all(fd, name.data(), name.size()))
      break;
    tensor operand;
    if (h.has_tensor) {
      try {
        operand.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
      } catch (const std::bad_alloc&) {
        send_error(fd, af_error::invalid_argument,
                   node_name_ + " cannot allocate " + std::to_string(h.payload_bytes)
                     + " bytes for the operand of '" + name + "'");
        break; // the payload is still in the stream
      }
      if (h.payload_bytes > 0 && !read_all(fd, operand.mutable_bytes(), h.payload_bytes))
        break;
    } else if (h.payload_bytes > 0) {
      std::string ignored(h.payload_bytes, '\0');
      if (!read_all(fd, ignored.data(), ignored.size()))
        break;
    }
    auto found = dir_->get(name);
    auto& var = found.actor;
    if (!var) {
      if (!send_error(fd, af_error::not_found, "no variable '" + name + "' on " + node_name_))
        break;
      continue;
    }
    auto op = static_cast<wire::kind>(h.kind);
    bool want = h.want_value != 0;
    tensor value;
    uint64_t version = 0;
    caf::error err;
    auto on_value = [&](tensor& v, uint64_t ver) {
      value = std::move(v);
      version = ver;
    };
    auto on_error = [&](caf::error& e) { err = std::move(e); };
    // Fast path: an initialized variable is updated right here, under its lock.
    bool done = found.state && found.state->with([&](variable_state& st) {
      if (!st.initialized)
        return false; // a first value may release waiters: the actor's job
      if (op == wire::kind::read) {
        value = st.value;
        version = st.version;
        return true;
      }
      auto v = st.update(op == wire::kind::assign ? nullptr
                         : op == wire::kind::assign_add ? "add" : "sub",
                         operand);
      if (!v) {
        err = std::move(v.error());
      } else {
        version = *v;
        if (want)
          value = st.value;
      }
      return true;
    });
    if (!done)
      self->request(var, variable_timeout, var_op_atom::value, static_cast<var_op>(op),
                    std::move(operand), want)
        .receive(on_value, on_error);
    if (err) {
      auto code = err.category() == error_category ? static_cast<af_error>(err.code())
                                                   : af_error::peer_down;
      if (!send_error(fd, code, describe(err)))
        break;
      continue;
    }
    wire::header reply;
    reply.kind = static_cast<uint8_t>(wire::kind::reply);
    reply.version = version;
    if (!value.empty() && !wire::describe_tensor(value, reply)) {
      if (!send_error(fd, af_error::invalid_argument,
                      "variable '" + name + "' has rank " + std::to_string(value.shape().size())
                        + "; the data plane carries rank <= 8"))
        break;
      continue;
    }
    // Straight from the variable's buffer: `value` shares it, no copy.
    if (!send_frame(fd, reply, nullptr, value.empty() ? nullptr : value.bytes()))
      break;
  }
  std::lock_guard<std::mutex> guard{mtx_};
  conns_.erase(std::remove(conns_.begin(), conns_.end(), fd), conns_.end());
  close(fd);
  finished_.push_back(std::this_thread::get_id());
}

// -- data_channel ----------------------------------------------------------------

caf::expected<std::unique_ptr<data_channel>>
data_channel::connect(const std::string& host, uint16_t port, std::string peer,
                      std::chrono::milliseconds timeout, std::chrono::microseconds poll) {
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
    timeval tv{static_cast<time_t>(timeout.count() / 1000),
               static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
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
  return std::unique_ptr<data_channel>{new data_channel(fd, std::move(peer), timeout, poll)};
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
data_channel::call(wire::kind op, const std::string& var, const tensor* operand, bool want_value) {
  auto what = std::string{op_name(op)} + " of '" + var + "'";
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  if (var.size() > wire::max_name)
    return make_error(af_error::invalid_argument, "variable name of " + std::to_string(var.size())
                                                    + " bytes is too long for the data plane");
  wire::header h;
  h.kind = static_cast<uint8_t>(op);
  h.want_value = want_value ? 1 : 0;
  h.name_len = static_cast<uint32_t>(var.size());
  if (operand != nullptr && !wire::describe_tensor(*operand, h))
    return make_error(af_error::invalid_argument,
                      what + ": rank " + std::to_string(operand->shape().size())
                        + " is more than the data plane carries (8)");
  if (!send_frame(fd_, h, &var, operand ? operand->bytes() : nullptr))
    return fail(what, errno);
  wire::header r;
  poll_for_reply();
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
      close(fd_);
      fd_ = -1;
      return make_error(af_error::invalid_argument, what + ": cannot allocate "
                                                      + std::to_string(r.payload_bytes)
                                                      + " bytes for the reply");
    }
    if (r.payload_bytes > 0 && !read_all(fd_, value.mutable_bytes(), r.payload_bytes))
      return fail(what, errno);
  }
  return std::make_pair(std::move(value), r.version);
}

} // namespace af
