#include "dist/allreduce.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "net/socket.hpp"
#include "net/tcp_connect.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr uint32_t hello_magic = 0x41464152;  // "AFAR"
constexpr uint32_t hello_version = 1;
constexpr uint32_t header_magic = 0x41464348; // "AFCH"
constexpr uint8_t hello_accepted = 1;
/// Bytes moved per send/recv call: small enough that a rank alternates
/// between receiving (and reducing) and forwarding, which is the pipeline.
constexpr size_t io_slice = 256 * 1024;
/// Socket buffers: a whole slice in flight each way without waiting for the
/// peer to drain it (the kernel caps this at net.core.[rw]mem_max).
constexpr int socket_buffer = 4 * 1024 * 1024;

struct hello {
  uint32_t magic = hello_magic;
  uint32_t version = hello_version;
  uint32_t rank = 0;
  uint32_t size = 0;
  uint32_t group_bytes = 0;
};

std::string key_of(const std::string& group, uint32_t rank) {
  return group + "/addr/" + std::to_string(rank);
}

void tune_socket(int fd) {
  sock::set_nodelay(fd);
  sock::set_buffers(fd, socket_buffer);
}

using sock::io_end;
using sock::ms_until;
using sock::transfer_by;

/// Splits "host:port" or "[v6]:port".
bool split_address(const std::string& addr, std::string& host, std::string& port) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    return false;
  host = addr.substr(0, colon);
  port = addr.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return true;
}

/// The host others reach this rank at.
std::string advertised_host(const std::string& bind_host) {
  std::string host = bind_host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) == 0)
      host = name;
  }
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

/// A listening socket on `bind_host` at an OS-picked port.
caf::expected<std::pair<int, uint16_t>> listen_on(const std::string& bind_host, const std::string& who) {
  // tune_socket before the bind: accepted sockets inherit the buffer sizes
  auto l = sock::listen_tcp(bind_host, 0, 16, tune_socket);
  if (!l.resolved)
    return make_error(af_error::bind_failed,
                      who + ": cannot resolve '" + bind_host + "' to listen on: " + l.why);
  if (l.fd < 0)
    return make_error(af_error::bind_failed, who + ": cannot listen on " + bind_host + " (" + l.why + ")");
  return std::make_pair(l.fd, l.port);
}

/// A connected socket to `host`:`port` by `deadline` (the end of the
/// group's `timeout`), or why not.
int connect_to(const std::string& host, const std::string& port, clock_type::time_point deadline,
               std::chrono::milliseconds timeout, std::string& why) {
  char* end = nullptr;
  errno = 0;
  auto number = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || errno != 0 || number == 0 || number > 65535) {
    why = "'" + port + "' is not a TCP port";
    return -1;
  }
  auto fd = tcp_connect(host, static_cast<uint16_t>(number), deadline, timeout,
                        "the group's timeout, for the rendezvous and the connects together",
                        tune_socket);
  if (!fd) {
    why = reason_of(fd.error());
    return -1;
  }
  return *fd;
}

void close_fd(int& fd) {
  if (fd >= 0) {
    close(fd);
    fd = -1;
  }
}

void add(float* __restrict target, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i)
    target[i] += src[i];
}

void add_and_divide(float* __restrict target, const float* __restrict src, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i)
    target[i] = (target[i] + src[i]) / divisor;
}

const char* op_name(uint8_t kind) {
  switch (kind) {
    case 1:
      return "allreduce_sum";
    case 2:
      return "allreduce_mean";
    case 3:
      return "broadcast";
    default:
      return "an unknown call";
  }
}

} // namespace

// -- rendezvous ------------------------------------------------------------------

caf::expected<std::unique_ptr<allreduce_group>>
allreduce_group::create(uint32_t rank, uint32_t size, const std::string& group, kv_client& store,
                        std::chrono::milliseconds timeout, const std::string& bind_host) {
  auto who = fmt::format("allreduce group '{}' rank {}", group, rank);
  if (size == 0 || rank >= size)
    return make_error(af_error::invalid_argument,
                      fmt::format("{}: the rank must be in [0, {}) (the group's size)", who, size));
  if (timeout.count() <= 0)
    return make_error(af_error::invalid_argument, who + ": the timeout must be positive");
  auto deadline = clock_type::now() + timeout;
  std::unique_ptr<allreduce_group> g{new allreduce_group(rank, size, group, timeout)};
  auto listening = listen_on(bind_host, who);
  if (!listening)
    return std::move(listening.error());
  int listen_fd = listening->first;
  struct closer {
    int& fd;
    ~closer() { close_fd(fd); }
  } close_listener{listen_fd};
  g->address_ = advertised_host(bind_host) + ":" + std::to_string(listening->second);
  if (auto err = store.put(key_of(group, rank), g->address_))
    return make_error(af_error::unreachable,
                      fmt::format("{}: cannot publish its address under '{}': {}", who,
                                  key_of(group, rank), describe(err)));
  if (size == 1)
    return g;
  // 1. Connect to the right neighbour and say who we are.
  auto right_key = key_of(group, g->right());
  auto right_addr = store.get(right_key, std::chrono::milliseconds{ms_until(deadline)});
  if (!right_addr)
    return make_error(is(right_addr.error(), af_error::timeout) ? af_error::timeout
                                                                : af_error::unreachable,
                      fmt::format("{}: waited {} ms for rank {} to publish its address under '{}'; "
                                  "did rank {} start and join? ({})",
                                  who, timeout.count(), g->right(), right_key, g->right(),
                                  describe(right_addr.error())));
  g->right_address_ = *right_addr;
  std::string host;
  std::string port;
  if (!split_address(*right_addr, host, port))
    return make_error(af_error::invalid_argument,
                      fmt::format("{}: rank {} published '{}' under '{}', not host:port", who,
                                  g->right(), *right_addr, right_key));
  std::string why;
  g->right_fd_ = connect_to(host, port, deadline, timeout, why);
  if (g->right_fd_ < 0)
    return make_error(af_error::unreachable,
                      fmt::format("{}: cannot connect to rank {} at {} (from '{}'): {}; is '{}' the "
                                  "name of an older group?",
                                  who, g->right(), *right_addr, right_key, why, group));
  std::string intro(sizeof(hello) + group.size(), '\0');
  hello mine;
  mine.rank = rank;
  mine.size = size;
  mine.group_bytes = static_cast<uint32_t>(group.size());
  std::memcpy(intro.data(), &mine, sizeof(mine));
  std::memcpy(intro.data() + sizeof(mine), group.data(), group.size());
  if (transfer_by(g->right_fd_, intro.data(), intro.size(), true, deadline) != io_end::done)
    return make_error(af_error::unreachable,
                      fmt::format("{}: rank {} at {} took no introduction within {} ms", who,
                                  g->right(), *right_addr, timeout.count()));
  // 2. Accept the left neighbour: strangers (another group, an older
  // incarnation, a port scanner) are turned away and we keep waiting.
  std::string refused;
  while (g->left_fd_ < 0) {
    auto rc = sock::poll_one(listen_fd, POLLIN, ms_until(deadline));
    if (rc <= 0)
      return make_error(af_error::timeout,
                        fmt::format("{}: waited {} ms for rank {} to connect to {}; did rank {} "
                                    "start and join?{}",
                                    who, timeout.count(), g->left(), g->address_, g->left(),
                                    refused.empty() ? "" : " (turned away: " + refused + ")"));
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0)
      continue;
    hello theirs;
    std::string their_group;
    auto got = transfer_by(fd, &theirs, sizeof(theirs), false, deadline);
    if (got == io_end::done && theirs.magic == hello_magic && theirs.version == hello_version
        && theirs.group_bytes <= kv_store_limits::max_key_bytes) {
      their_group.resize(theirs.group_bytes);
      got = transfer_by(fd, their_group.data(), their_group.size(), false, deadline);
    }
    if (got != io_end::done || theirs.magic != hello_magic || theirs.version != hello_version) {
      refused = "a connection that did not introduce itself as an allreduce rank";
    } else if (their_group != group || theirs.size != size || theirs.rank != g->left()) {
      refused = fmt::format("rank {} of {} of group '{}'", theirs.rank, theirs.size, their_group);
    } else {
      auto ok = hello_accepted;
      if (transfer_by(fd, &ok, 1, true, deadline) == io_end::done) {
        tune_socket(fd);
        g->left_fd_ = fd;
        break;
      }
      refused = fmt::format("rank {}, which went away", g->left());
    }
    close(fd);
  }
  // 3. Wait for the right neighbour to accept us in turn.
  uint8_t answer = 0;
  auto got = transfer_by(g->right_fd_, &answer, 1, false, deadline);
  if (got == io_end::timed_out)
    return make_error(af_error::timeout,
                      fmt::format("{}: waited {} ms for rank {} at {} to accept its connection; did "
                                  "rank {} stop while joining?",
                                  who, timeout.count(), g->right(), *right_addr, g->right()));
  if (got != io_end::done || answer != hello_accepted)
    return make_error(af_error::unreachable,
                      fmt::format("{}: rank {} at {} turned its connection away; is another group "
                                  "of another size or an older incarnation using the name '{}'?",
                                  who, g->right(), *right_addr, group));
  return g;
}

allreduce_group::~allreduce_group() {
  close_fd(left_fd_);
  close_fd(right_fd_);
}

// -- collectives -----------------------------------------------------------------

std::string allreduce_group::who() const {
  return fmt::format("allreduce group '{}' rank {}", group_, rank_);
}

std::string allreduce_group::describe_call(op kind, size_t n, uint32_t root) const {
  if (kind == op::broadcast)
    return fmt::format("broadcast of {} floats from rank {}", n, root);
  return fmt::format("{} of {} floats", op_name(static_cast<uint8_t>(kind)), n);
}

caf::error allreduce_group::fail(caf::error err) {
  broken_ = describe(err);
  // The neighbours see the sockets close at once and fail in turn, instead
  // of waiting for their timeouts.
  if (left_fd_ >= 0)
    ::shutdown(left_fd_, SHUT_RDWR);
  if (right_fd_ >= 0)
    ::shutdown(right_fd_, SHUT_RDWR);
  return err;
}

caf::error allreduce_group::allreduce_mean(float* data, size_t n) {
  return reduce(op::mean, data, n);
}

caf::error allreduce_group::allreduce_sum(float* data, size_t n) {
  return reduce(op::sum, data, n);
}

caf::error allreduce_group::reduce(op kind, float* data, size_t n) {
  if (!broken_.empty())
    return make_error(af_error::aborted, who() + " is broken since an earlier call failed ("
                                           + broken_ + "); build a new group");
  if (n > 0 && data == nullptr)
    return make_error(af_error::invalid_argument, who() + ": " + describe_call(kind, n, 0)
                                                    + " with no data");
  if (size_ == 1)
    return caf::none; // the sum and the mean of one
  // Segment c of the data: its first float and its length. Rank r owns the
  // sum of segment r + 1 at the end of the reduce-scatter.
  auto seg_len = [&](uint32_t c) { return n / size_ + (c < n % size_ ? 1 : 0); };
  auto seg_off = [&](uint32_t c) { return c * (n / size_) + std::min<size_t>(c, n % size_); };
  auto seg = [&](int64_t c) { return static_cast<uint32_t>(((c % size_) + size_) % size_); };
  try {
    if (scratch_.size() < seg_len(0))
      scratch_.resize(seg_len(0));
  } catch (const std::bad_alloc&) {
    return make_error(af_error::resource_exhausted,
                      fmt::format("{}: no memory for a {}-float buffer for {}", who(), seg_len(0),
                                  describe_call(kind, n, 0)));
  }
  auto* bytes = reinterpret_cast<char*>(data);
  auto* scratch = reinterpret_cast<char*>(scratch_.data());
  std::vector<out_part> outs;
  std::vector<in_part> ins;
  auto steps = 2 * (size_ - 1);
  outs.reserve(steps + 1);
  ins.reserve(steps + 1);
  ins.push_back({in_part::header, reinterpret_cast<char*>(&received_), sizeof(received_)});
  for (uint32_t t = 0; t < steps; ++t) {
    // What is sent in step t is what arrived (and was reduced) in step t - 1:
    // part t of the incoming stream (part 0 is the header).
    int after = t == 0 ? -1 : static_cast<int>(t);
    bool scatter = t < size_ - 1;
    auto s = static_cast<int64_t>(scatter ? t : t - (size_ - 1));
    auto send_seg = scatter ? seg(rank_ - s) : seg(rank_ + 1 - s);
    auto recv_seg = scatter ? seg(rank_ - s - 1) : seg(rank_ - s);
    outs.push_back({bytes + seg_off(send_seg) * sizeof(float), seg_len(send_seg) * sizeof(float), after});
    in_part in{scatter ? in_part::reduce : in_part::copy,
               scatter ? scratch : bytes + seg_off(recv_seg) * sizeof(float),
               seg_len(recv_seg) * sizeof(float)};
    if (scatter) {
      in.target = data + seg_off(recv_seg);
      if (kind == op::mean && t == size_ - 2)
        in.divisor = static_cast<float>(size_);
    }
    ins.push_back(in);
  }
  return run(kind, n, 0, outs, ins);
}

caf::error allreduce_group::broadcast(float* data, size_t n, uint32_t root) {
  if (!broken_.empty())
    return make_error(af_error::aborted, who() + " is broken since an earlier call failed ("
                                           + broken_ + "); build a new group");
  if (root >= size_)
    return make_error(af_error::invalid_argument,
                      fmt::format("{}: broadcast from rank {}, but the group has ranks 0 to {}", who(),
                                  root, size_ - 1));
  if (n > 0 && data == nullptr)
    return make_error(af_error::invalid_argument,
                      who() + ": " + describe_call(op::broadcast, n, root) + " with no data");
  if (size_ == 1)
    return caf::none;
  // Along the ring from the root: each rank forwards what it has received,
  // except the last one (the root's left).
  auto* bytes = reinterpret_cast<char*>(data);
  std::vector<out_part> outs;
  std::vector<in_part> ins;
  ins.push_back({in_part::header, reinterpret_cast<char*>(&received_), sizeof(received_)});
  if (rank_ != root)
    ins.push_back({in_part::copy, bytes, n * sizeof(float)});
  if (right() != root)
    outs.push_back({bytes, n * sizeof(float), rank_ == root ? -1 : 1});
  return run(op::broadcast, n, root, outs, ins);
}

caf::error allreduce_group::check_header(op kind, size_t n, uint32_t root) {
  const auto& h = received_;
  if (h.magic != header_magic)
    return make_error(af_error::internal,
                      fmt::format("{}: rank {} sent something that is not a call header; is it of "
                                  "another version?",
                                  who(), left()));
  if (h.kind == sent_.kind && h.count == sent_.count && h.root == sent_.root
      && h.call == sent_.call && h.ranks == sent_.ranks)
    return caf::none;
  auto theirs = h.kind == static_cast<uint8_t>(op::broadcast)
                  ? fmt::format("broadcast of {} floats from rank {}", h.count, h.root)
                  : fmt::format("{} of {} floats", op_name(h.kind), h.count);
  return make_error(af_error::invalid_argument,
                    fmt::format("{}: rank {}'s call #{} is {} (group of {}), this rank's call "
                                "#{} is {}; every rank must make the same calls in the same order",
                                who(), left(), h.call, theirs, h.ranks, sent_.call,
                                describe_call(kind, n, root)));
}

caf::error allreduce_group::run(op kind, size_t n, uint32_t root, std::vector<out_part>& outs,
                                std::vector<in_part>& ins) {
  sent_ = call_header{};
  sent_.magic = header_magic;
  sent_.kind = static_cast<uint8_t>(kind);
  sent_.root = root;
  sent_.ranks = size_;
  sent_.call = ++calls_;
  sent_.count = n;
  received_ = call_header{};
  auto call = describe_call(kind, n, root);
  size_t oi = 0;       // outgoing part being sent
  size_t sent = 0;     // its bytes sent
  size_t ii = 0;       // incoming part being received
  size_t received = 0; // its bytes received
  size_t done = 0;     // its bytes processed (reduced, checked): forwardable
  auto processed = [&](int part) -> size_t {
    auto p = static_cast<size_t>(part);
    return p < ii ? ins[p].bytes : p == ii ? done : 0;
  };
  auto closed = [&](uint32_t peer, const char* how) {
    return fail(make_error(af_error::peer_down,
                           fmt::format("{}: rank {} closed its connection ({}) during {}; did it "
                                       "fail, leave the group or die?",
                                       who(), peer, how, call)));
  };
  // Our header goes first, before anything we read can fail the call: a
  // peer in another call learns of it from the header, not from our hang-up.
  switch (transfer_by(right_fd_, &sent_, sizeof(sent_), true, clock_type::now() + timeout_)) {
    case io_end::done:
      break;
    case io_end::closed:
      return closed(right(), "refused our call's header");
    case io_end::timed_out:
      return fail(make_error(af_error::timeout,
                             fmt::format("{}: {} made no progress for {} ms waiting for rank {} at {} "
                                         "to take the call's header; is it alive?",
                                         who(), call, timeout_.count(), right(), right_address_)));
    default:
      return fail(make_error(af_error::peer_down,
                             fmt::format("{}: sending to rank {} at {} failed during {}: {}", who(),
                                         right(), right_address_, call, std::strerror(errno))));
  }
  for (;;) {
    while (oi < outs.size() && sent == outs[oi].bytes) {
      ++oi;
      sent = 0;
    }
    while (ii < ins.size() && done == ins[ii].bytes) {
      ++ii;
      received = done = 0;
    }
    if (oi == outs.size() && ii == ins.size())
      return caf::none;
    bool moved = false;
    size_t limit = 0;
    // Reading first: what the left sent before it failed (its header, say)
    // tells more than the right's hang-up.
    if (ii < ins.size()) {
      auto& in = ins[ii];
      auto r = ::recv(left_fd_, in.buf + received, std::min(in.bytes - received, io_slice),
                      MSG_DONTWAIT);
      if (r > 0) {
        received += static_cast<size_t>(r);
        moved = true;
        if (in.kind == in_part::copy) {
          done = received;
        } else if (in.kind == in_part::reduce) {
          auto from = done / sizeof(float);
          auto to = received / sizeof(float);
          auto* src = reinterpret_cast<const float*>(in.buf) + from;
          if (in.divisor != 0)
            add_and_divide(in.target + from, src, to - from, in.divisor);
          else
            add(in.target + from, src, to - from);
          done = to * sizeof(float);
        } else if (received == in.bytes) {
          if (auto err = check_header(kind, n, root))
            return fail(std::move(err));
          done = received;
        }
      } else if (r == 0) {
        return closed(left(), "end of stream");
      } else if (errno == ECONNRESET) {
        return closed(left(), std::strerror(errno));
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return fail(make_error(af_error::peer_down,
                               fmt::format("{}: receiving from rank {} failed during {}: {}", who(),
                                           left(), call, std::strerror(errno))));
      }
    }
    if (oi < outs.size()) {
      auto& o = outs[oi];
      limit = o.after < 0 ? o.bytes : std::min(o.bytes, processed(o.after));
      if (limit > sent) {
        auto r = ::send(right_fd_, o.src + sent, std::min(limit - sent, io_slice),
                        MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) {
          sent += static_cast<size_t>(r);
          moved = true;
        } else if (errno == EPIPE || errno == ECONNRESET) {
          return closed(right(), std::strerror(errno));
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return fail(make_error(af_error::peer_down,
                                 fmt::format("{}: sending to rank {} at {} failed during {}: {}",
                                             who(), right(), right_address_, call,
                                             std::strerror(errno))));
        }
      }
    }
    if (moved)
      continue;
    // Nothing moved: sleep until a socket is ready. While there is something
    // left to send, the right socket is watched for its peer hanging up too.
    pollfd pfds[2];
    nfds_t count = 0;
    bool want_in = ii < ins.size();
    bool want_out = oi < outs.size();
    if (want_in)
      pfds[count++] = {left_fd_, POLLIN, 0};
    if (want_out)
      pfds[count++] = {right_fd_, static_cast<short>(POLLRDHUP | (limit > sent ? POLLOUT : 0)), 0};
    auto rc = ::poll(pfds, count, static_cast<int>(std::min<int64_t>(timeout_.count(),
                                                                     std::numeric_limits<int>::max())));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc < 0)
      return fail(make_error(af_error::internal,
                             fmt::format("{}: poll failed during {}: {}", who(), call, std::strerror(errno))));
    if (rc == 0) {
      std::string waited;
      if (want_in)
        waited = fmt::format("rank {} to send (part {} of {}: {} of {} bytes)", left(), ii + 1,
                             ins.size(), received, ins[ii].bytes);
      else
        waited = fmt::format("rank {} at {} to take its data ({} of {} bytes of part {} of {})",
                             right(), right_address_, sent, outs[oi].bytes, oi + 1, outs.size());
      return fail(make_error(af_error::timeout,
                             fmt::format("{}: {} made no progress for {} ms waiting for {}; is it "
                                         "alive and in the same call?",
                                         who(), call, timeout_.count(), waited)));
    }
    if (want_in && (pfds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0)
      continue; // read what there is before judging the right's hang-up
    if (want_out) {
      auto ev = pfds[count - 1].revents;
      if ((ev & (POLLRDHUP | POLLHUP | POLLERR)) != 0 && !(ev & POLLOUT && limit > sent))
        return closed(right(), "hung up");
    }
  }
}

} // namespace af
