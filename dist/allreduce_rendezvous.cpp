// The all-reduce group's set-up (dist/allreduce.hpp): the rendezvous through
// the store, the connections to the neighbours, and the shared-memory offers;
// the collectives are in allreduce.cpp.
#include "dist/allreduce.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "net/shm_ring.hpp"
#include "net/socket.hpp"
#include "net/tcp_connect.hpp"
#include "net/testing_hooks.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr uint32_t hello_magic = 0x41464152;  // "AFAR"
constexpr uint32_t hello_version = 2; // 2: the shared-memory offers after the hellos
constexpr uint8_t hello_accepted = 1;
constexpr uint32_t offer_magic = 0x4146534f; // "AFSO"
constexpr uint8_t offer_taken = 1;
/// Socket buffers: a whole slice in flight each way without waiting for the
/// peer to drain it (the kernel caps this at net.core.[rw]mem_max).
constexpr int socket_buffer = 4 * 1024 * 1024;

/// What a rank offers its right neighbour after the hellos: the name of a
/// segment (name_bytes > 0, then the name), or none (TCP).
struct shm_offer {
  uint32_t magic = offer_magic;
  uint32_t name_bytes = 0;
  uint64_t segment_bytes = 0;
};

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

/// A test's failure of this rank's end of a shared-memory link
/// (net/testing_hooks.hpp: never in a program), or none.
caf::error test_hook_failure(const std::string& group, uint32_t rank, const char* end) {
  auto* hooks = wire_test_hooks();
  if (hooks == nullptr || !hooks->allreduce_shm_setup)
    return caf::none;
  return hooks->allreduce_shm_setup(group, rank, end);
}

void close_fd(int& fd) {
  if (fd >= 0) {
    close(fd);
    fd = -1;
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
  // 4. Shared memory for the links whose two ends are on this host.
  if (auto err = g->negotiate_shm(deadline))
    return err;
  // 5. Two ranks are each other's left and right: one connection (rank 0's
  // to rank 1) carries both directions from here, as the raw exchange's
  // one socket, so that each side's acknowledgements ride on its own data.
  if (size == 2) {
    if (rank == 0) {
      close_fd(g->left_fd_);
      g->left_fd_ = g->right_fd_;
    } else {
      close_fd(g->right_fd_);
      g->right_fd_ = g->left_fd_;
    }
  }
  return g;
}

caf::error allreduce_group::negotiate_shm(clock_type::time_point deadline) {
  auto off = [] { return shm_channel::disabled_by_environment(); };
  // Ours, to the right: every rank sends its offer before it reads one, so
  // that no rank waits for another's answer to make its own offer.
  std::unique_ptr<shm_link> mine;
  if (off()) {
    out_why_tcp_ = "ACTORFLOW_DATA_SHM=off here";
  } else if (!shm_channel::same_host(right_fd_)) {
    out_why_tcp_ = "on another host";
  } else if (auto hooked = test_hook_failure(group_, rank_, "create")) {
    out_why_tcp_ = describe(hooked);
  } else if (auto l = shm_link::create()) {
    mine = std::move(*l);
  } else {
    out_why_tcp_ = describe(l.error());
  }
  shm_offer offer;
  std::string wire(sizeof(offer), '\0');
  if (mine) {
    offer.name_bytes = static_cast<uint32_t>(mine->name().size());
    offer.segment_bytes = mine->segment_bytes();
    wire += mine->name();
  }
  std::memcpy(wire.data(), &offer, sizeof(offer));
  if (transfer_by(right_fd_, wire.data(), wire.size(), true, deadline) != io_end::done)
    return make_error(af_error::unreachable,
                      fmt::format("{}: rank {} at {} took no shared-memory offer within {} ms", who(),
                                  right(), right_address_, timeout_.count()));
  // The left's, answered.
  shm_offer theirs;
  std::string name;
  auto got = transfer_by(left_fd_, &theirs, sizeof(theirs), false, deadline);
  if (got == io_end::done && theirs.magic == offer_magic && theirs.name_bytes <= 255) {
    name.resize(theirs.name_bytes);
    got = transfer_by(left_fd_, name.data(), name.size(), false, deadline);
  }
  if (got != io_end::done || theirs.magic != offer_magic || theirs.name_bytes > 255)
    return make_error(af_error::unreachable,
                      fmt::format("{}: rank {} sent no shared-memory offer within {} ms (is it of "
                                  "another version, or did it stop?)",
                                  who(), left(), timeout_.count()));
  uint8_t answer = 0;
  if (name.empty()) {
    in_why_tcp_ = fmt::format("rank {} offered none", left());
  } else if (off()) {
    in_why_tcp_ = "ACTORFLOW_DATA_SHM=off here";
  } else if (!shm_channel::same_host(left_fd_)) {
    in_why_tcp_ = "on another host";
  } else if (auto hooked = test_hook_failure(group_, rank_, "open")) {
    in_why_tcp_ = describe(hooked);
  } else if (auto l = shm_link::open(name, theirs.segment_bytes)) {
    in_shm_ = std::move(*l);
    answer = offer_taken;
  } else {
    in_why_tcp_ = describe(l.error());
  }
  if (transfer_by(left_fd_, &answer, 1, true, deadline) != io_end::done)
    return make_error(af_error::unreachable,
                      fmt::format("{}: rank {} took no answer to its shared-memory offer within {} ms",
                                  who(), left(), timeout_.count()));
  // The right's answer to ours.
  uint8_t taken = 0;
  if (transfer_by(right_fd_, &taken, 1, false, deadline) != io_end::done)
    return make_error(af_error::unreachable,
                      fmt::format("{}: rank {} at {} did not answer its shared-memory offer within "
                                  "{} ms",
                                  who(), right(), right_address_, timeout_.count()));
  if (mine) {
    mine->unlink(); // mapped by the right (or declined): the name goes either way
    if (taken == offer_taken)
      out_shm_ = std::move(mine);
    else
      out_why_tcp_ = fmt::format("rank {} declined it", right());
  }
  one_transport_for_two();
  return caf::none;
}

void allreduce_group::one_transport_for_two() {
  // Two ranks keep one connection for both directions (create()'s step 5).
  // A link in shared memory rings its bells on it, a link on TCP streams its
  // data on it: a direction on each would put the one's bells inside the
  // other's data (corrupt frames, or a hang). Both ranks know how both links
  // went (each offer's answer says whether its reader mapped it), so both
  // take this same decision without another exchange: if either link is on
  // TCP, both are.
  if (size_ != 2 || (out_shm_ != nullptr) == (in_shm_ != nullptr))
    return;
  if (out_shm_) {
    fell_back_ = fmt::format("the link from rank {} is on TCP ({})", left(), in_why_tcp_);
    out_shm_.reset();
    out_why_tcp_ = "fell back with the link from rank " + std::to_string(left());
  } else {
    fell_back_ = fmt::format("the link to rank {} is on TCP ({})", right(), out_why_tcp_);
    in_shm_.reset();
    in_why_tcp_ = "fell back with the link to rank " + std::to_string(right());
  }
}

std::string allreduce_group::transport() const {
  if (size_ == 1)
    return "none (a group of one)";
  auto link = [](bool shm, const std::string& why) {
    return shm ? std::string{"shared memory"} : "TCP (" + why + ")";
  };
  if (size_ == 2 && out_shm_ && in_shm_)
    return fmt::format("shared memory to and from rank {}", right());
  if (size_ == 2 && !fell_back_.empty())
    return fmt::format("TCP to and from rank {}: shared memory fell back to TCP, as {} and both "
                       "directions share one connection",
                       right(), fell_back_);
  return fmt::format("{} to rank {}, {} from rank {}", link(out_shm_ != nullptr, out_why_tcp_),
                     right(), link(in_shm_ != nullptr, in_why_tcp_), left());
}

allreduce_group::~allreduce_group() {
  if (left_fd_ == right_fd_) // two ranks: one connection
    right_fd_ = -1;
  close_fd(left_fd_);
  close_fd(right_fd_);
}

} // namespace af
