#pragma once
/// The data plane between hosts of a trusted fabric: UCX (issue 12, part 1,
/// "other hosts"; docs/wire.md "UCX").
///
/// A data-plane connection moves to UCX after its first answered op when the
/// peer is on another host, both ends say `[security] trusted_fabric = true`
/// and both are built with libucx-dev: the client names its UCP worker's
/// address in a `ucx_offer` frame (core/wire_format.hpp), the node creates a
/// worker and an endpoint to it and answers with its own worker's address,
/// and from then on the frames go, byte for byte as they would through the
/// socket, over the UCP stream API on that pair of endpoints (UCX picks RDMA
/// where the NICs have it, TCP otherwise). The TCP connection (TLS included)
/// stays open beside it for liveness: nothing is sent on it any more, so a
/// byte or an EOF there means the peer closed or died, seen as fast as on a
/// plain socket. Waits sleep in poll on the worker's event fd and the socket
/// together, bounded as the socket's reads and sends are (deadline, stall,
/// cancel flag). No TLS on this path: see docs/security.md "Trusted fabric".
///
/// One ucp_context per process, one worker (and one endpoint) per connection,
/// driven only by that connection's thread. Built without UCX, create()
/// says so and available() is false: every connection stays on TCP/TLS.

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "caf/expected.hpp"

#include "net/ring_status.hpp"
#include "net/testing_hooks.hpp"
#include "messages/error.hpp"

namespace af {

/// The process's own `[security] trusted_fabric` (set by start_node and by
/// a session from their configs): data channels opened by this process's
/// code that has no config at hand (a worker's pushes, an executor's remote
/// reads) offer UCX when it is set. Only what this process offers: a data
/// plane takes UCX from its own limits (data_plane_limits::trusted_fabric)
/// alone, never from this flag, which any part of the process may set.
/// Starts false; a test binary's hook (net/testing_hooks.hpp) may set it.
inline std::atomic<bool>& process_trusted_fabric() {
  static std::atomic<bool> trusted{test_hooks_trust_fabric()};
  return trusted;
}

/// Peers ("host:port") whose UCX path failed lately (the client could not
/// reach the node's worker, or the first op over UCX failed): data channels
/// to them offer no UCX for `ucx_failure_memory` after it, so that every
/// fresh channel does not meet the same failure again.
constexpr std::chrono::minutes ucx_failure_memory{5};

inline std::pair<std::mutex, std::unordered_map<std::string, std::chrono::steady_clock::time_point>>&
ucx_failures() {
  static std::pair<std::mutex, std::unordered_map<std::string, std::chrono::steady_clock::time_point>> f;
  return f;
}

inline void remember_ucx_failure(const std::string& peer) {
  auto& [mutex, map] = ucx_failures();
  std::lock_guard<std::mutex> guard{mutex};
  map[peer] = std::chrono::steady_clock::now();
}

inline bool ucx_failed_recently(const std::string& peer) {
  auto& [mutex, map] = ucx_failures();
  std::lock_guard<std::mutex> guard{mutex};
  auto it = map.find(peer);
  if (it == map.end())
    return false;
  if (std::chrono::steady_clock::now() - it->second < ucx_failure_memory)
    return true;
  map.erase(it);
  return false;
}

/// One connection's UCP worker and endpoint.
class ucx_channel {
public:
  using status = ring_status;
  using bound = ring_bound;

  /// An address (in its envelope) longer than this is refused unread.
  static constexpr uint64_t max_address_bytes = uint64_t{64} << 10;

  /// True if built with UCX and this process's UCP context could be made
  /// (its first call makes it; the reason it could not is logged once).
  static bool available();

  /// ACTORFLOW_DATA_UCX=off (0, no, false): never offer UCX.
  static bool disabled_by_environment();

  /// ACTORFLOW_DATA_UCX=force: offer UCX even to a peer on this host (instead
  /// of shared memory): an operator's and the bench's knob (the `_ucx`
  /// metrics of bench/shm_benches.cpp), which the tests use too. It cannot
  /// turn off encryption: the fabric must still be trusted ([security]
  /// trusted_fabric, or a test binary's hook: net/testing_hooks.hpp).
  static bool forced_by_environment();

  /// A fresh worker; address() is what the peer needs to reach it.
  static caf::expected<std::unique_ptr<ucx_channel>> create();

  /// Why `peer_address` (an offer's payload) is not a worker address of
  /// actorflow's with this UCX's address format, or empty if it may be one.
  /// Cheap (no worker is made), so a node checks an offer before it makes a
  /// worker for it. Not a full check: UCX parses the rest of an address
  /// without hardening (docs/security.md "Trusted fabric").
  static std::string check_offer(const std::string& peer_address);

  ~ucx_channel();
  ucx_channel(const ucx_channel&) = delete;
  ucx_channel& operator=(const ucx_channel&) = delete;

  /// This worker's address in its envelope (a magic, the length and a
  /// checksum, so that garbage is refused before UCX parses it).
  const std::string& address() const { return address_; }

  /// Connects this worker's endpoint to the peer's address (as its
  /// address() gave it); an error (naming what is wrong) if it is not one.
  caf::error connect(const std::string& peer_address);

  /// Writes all of `iov` to the peer; `fd` is the connection's socket
  /// (liveness only). After anything but done the channel is broken.
  status write(const iovec* iov, int count, int fd, const bound& b, uint64_t* moved = nullptr);

  /// Reads exactly `n` bytes into `dst`. `moved`: bytes read.
  status read(void* dst, uint64_t n, int fd, const bound& b, uint64_t* moved = nullptr);

  /// Waits as read() does until a byte has arrived, taking none: done,
  /// closed (the endpoint failed or the peer's socket ended) or timeout (b's
  /// deadline; b's stall bounds are not used). A timeout leaves the stream
  /// whole. A sparse step's look at which answer came first
  /// (net/data_channel_sparse.cpp).
  status await_bytes(int fd, const bound& b);

  /// "ucx (tcp)", "ucx (rc_mlx5, ...)": UCX's transports of the endpoint.
  const std::string& transport() const { return transport_; }

  struct impl;

private:
  ucx_channel() = default;
  std::unique_ptr<impl> impl_;
  std::string address_;
  std::string transport_ = "ucx";
};

#ifndef ACTORFLOW_WITH_UCX
// Built without libucx-dev: nothing offers or takes UCX.
struct ucx_channel::impl {};
inline bool ucx_channel::available() { return false; }
inline bool ucx_channel::disabled_by_environment() { return true; }
inline bool ucx_channel::forced_by_environment() { return false; }
inline caf::expected<std::unique_ptr<ucx_channel>> ucx_channel::create() {
  return make_error(af_error::unsupported, "this build has no UCX (apt-get install libucx-dev and "
                                           "build again)");
}
inline ucx_channel::~ucx_channel() = default;
inline std::string ucx_channel::check_offer(const std::string&) {
  return "this build has no UCX";
}
inline caf::error ucx_channel::connect(const std::string&) {
  return make_error(af_error::unsupported, "this build has no UCX");
}
inline ucx_channel::status ucx_channel::write(const iovec*, int, int, const bound&, uint64_t*) {
  return status::closed;
}
inline ucx_channel::status ucx_channel::read(void*, uint64_t, int, const bound&, uint64_t*) {
  return status::closed;
}
inline ucx_channel::status ucx_channel::await_bytes(int, const bound&) {
  return status::closed;
}
#endif

} // namespace af
