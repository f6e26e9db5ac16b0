#pragma once
/// The data plane's limits (net/data_plane.hpp), from the node's options.

#include <chrono>
#include <cstdint>

#include "net/testing_hooks.hpp"
#include "net/ucx_link.hpp"

namespace af {

/// What one connection, client or stranger may make the data plane hold
/// (node_options: data_idle_timeout_ms, data_frame_timeout_ms,
/// max_message_bytes, max_variable_bytes, max_data_connections).
struct data_plane_limits {
  /// Between frames: a client that sends nothing for this long is dropped
  /// (it reconnects on its next op).
  std::chrono::milliseconds idle{std::chrono::minutes{10}};
  /// Within a frame: a peer that stops in the middle of a header, name or
  /// payload for this long is dropped, so it cannot hold a thread forever.
  /// Bounds a TLS handshake as well.
  std::chrono::milliseconds frame{std::chrono::seconds{5}};
  /// A frame whose payload is larger is refused before anything is allocated
  /// ([node] max_message_bytes).
  int64_t max_message_bytes = int64_t{2} << 30;
  /// An operand that would make a variable larger is refused ([node]
  /// max_variable_bytes).
  int64_t max_variable_bytes = int64_t{2} << 30;
  /// Connections served at once; one more is closed at once ([node]
  /// max_data_connections).
  int32_t max_connections = 256;
  /// Takes a plaintext client's offer of shared memory (a client on this
  /// host; docs/wire.md "Shared memory"). False: every client stays on TCP,
  /// as if it were on another host.
  bool shared_memory = true;
  /// How long a connection's thread spins for the next frame after a reply
  /// before it sleeps (in recv on TCP; on the ring's futex, which the
  /// client wakes, on shared memory: net/shm_ring.hpp), and on shared memory
  /// for bytes within one. Skipped while such spins keep failing
  /// (net/adaptive_spin.hpp). Not over TLS.
  std::chrono::microseconds spin{20};
  /// The most shared memory this server maps for its clients at once, all
  /// connections together (each takes 8 MiB + 4 KiB by default); an offer
  /// past it is declined and that client stays on TCP.
  int64_t max_shm_bytes = int64_t{1} << 30;
  /// Takes a client's offer of UCX ([security] trusted_fabric; docs/wire.md
  /// "UCX"): the frames after it go unencrypted over UCX. False: declined,
  /// the client stays on TCP/TLS. Only this decides (never the process's
  /// flag); a test binary's hook (net/testing_hooks.hpp) starts it true.
  bool trusted_fabric = test_hooks_trust_fabric();
};

/// The old name (timeouts only), for code not yet moved to the limits.
using data_plane_timeouts = data_plane_limits;

} // namespace af
