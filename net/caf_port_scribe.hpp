#pragma once
/// The CAF port's connections (net/caf_port.hpp), internal to it: the
/// scribes that net/caf_port_scribe.cpp makes (the handshake guard, TLS
/// through a session of ours) for the acceptor and connect_scribe
/// (net/caf_port.cpp).

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "caf/io/fwd.hpp"
#include "caf/io/network/native_socket.hpp"

#include "net/caf_port.hpp"
#include "net/tls.hpp"

namespace caf::io::network {
class default_multiplexer;
} // namespace caf::io::network

namespace af {

/// A connection whose BASP handshake is not done yet, as the deadline's
/// thread (accepted ones) or the connect request's caller (opened ones)
/// sees it. `live` turns false (under `mtx`) before the scribe closes the
/// socket, so nobody shuts down a descriptor that was closed and reused.
struct pending_handshake {
  std::mutex mtx;
  caf::io::network::native_socket fd;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  bool live = true;
  bool timed_out = false;
  std::string failure; ///< an opened one's: why its TLS handshake failed
  explicit pending_handshake(caf::io::network::native_socket s) : fd(s) {}
};

namespace caf_port_detail {

/// "host:port" of the peer of `fd` ("[v6]:port"), for the log lines.
std::string peer_of(caf::io::network::native_socket fd);

/// A scribe for connection `fd`, with the handshake guard (pre-handshake
/// size cap; its hold on `pending` until the peer's handshake went through)
/// and, when `tls` is set, TLS through a session of ours on the process's
/// context. `outbound`: a connection this process opened to `host`, whose
/// certificate must be for `host` (and `task`, when set), and which the BASP
/// broker's heartbeat leaves alone until `hold_until` (the connect's
/// deadline). Null when TLS cannot be set up (out of memory: tls_errors says).
caf::io::scribe_ptr make_scribe(caf::io::network::default_multiplexer& mpx,
                                caf::io::network::native_socket fd, const tls_context* tls,
                                std::shared_ptr<const caf_port_options> opts, bool outbound,
                                const std::string& host, const std::string& task,
                                std::shared_ptr<pending_handshake> pending,
                                std::chrono::steady_clock::time_point hold_until = {});

} // namespace caf_port_detail

} // namespace af
