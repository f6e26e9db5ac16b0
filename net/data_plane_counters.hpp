#pragma once
/// What a node's data plane has done, counted as it happens for whoever
/// watches the node (metrics/node_metrics.hpp reads them at each scrape):
/// relaxed atomic increments only, so that the serve loop gains no lock.
/// Counts since the server started; gauges (`open`) are now.

#include <array>
#include <atomic>
#include <cstdint>

namespace af {

/// How a served connection carries its frames now (a connection moves from
/// tcp or tls to shm or ucx after its client's offer).
enum class plane_transport : uint8_t { tcp, tls, shm, ucx };
inline constexpr size_t plane_transport_count = 4;

/// "tcp", "tls", "shm", "ucx": the metrics' label values.
inline const char* to_string(plane_transport t) {
  switch (t) {
    case plane_transport::tcp: return "tcp";
    case plane_transport::tls: return "tls";
    case plane_transport::shm: return "shm";
    case plane_transport::ucx: return "ucx";
  }
  return "?";
}

/// Why the data plane refused a connection or dropped one at its first bad frame.
enum class plane_refusal : uint8_t {
  max_connections, ///< [node] max_data_connections were open
  handshakes,      ///< its host had max_handshakes_per_host TLS handshakes in progress
  tls,             ///< its TLS handshake or first record failed (a stranger, a plaintext client)
  bad_frame        ///< a frame that is not actorflow's (the connection was closed)
};
inline constexpr size_t plane_refusal_count = 4;

/// "max_connections", "handshakes", "tls", "bad_frame": the metrics' label values.
inline const char* to_string(plane_refusal r) {
  switch (r) {
    case plane_refusal::max_connections: return "max_connections";
    case plane_refusal::handshakes: return "handshakes";
    case plane_refusal::tls: return "tls";
    case plane_refusal::bad_frame: return "bad_frame";
  }
  return "?";
}

struct data_plane_counters {
  /// Per transport: variable ops (read, assign, assign_add, ..., gather)
  /// served, and the bytes of their request and reply frames. A cache line
  /// (64 bytes on the x86-64 and arm64 machines it runs on) of its own: the
  /// serve loops of two transports (a tcp and an shm connection, each on its
  /// own thread) increment theirs at every frame, and counters that shared
  /// a line would bounce it between their cores.
  struct alignas(64) per_transport {
    std::atomic<uint64_t> variable_ops{0};
    std::atomic<uint64_t> bytes_received{0}; ///< every request frame (header, name, payload)
    std::atomic<uint64_t> bytes_sent{0};     ///< every reply frame (header and payload)
    std::atomic<uint64_t> requests{0};       ///< every request frame (ops, pushes, edges)
  };
  std::array<per_transport, plane_transport_count> transports;
  static_assert(sizeof(per_transport) == 64, "one transport's counters: one cache line");
  std::atomic<uint64_t> accepted{0}; ///< connections admitted (a thread serves each)
  std::atomic<int64_t> open{0};      ///< connections served now
  std::array<std::atomic<uint64_t>, plane_refusal_count> refused{};

  per_transport& of(plane_transport t) { return transports[static_cast<size_t>(t)]; }
  const per_transport& of(plane_transport t) const { return transports[static_cast<size_t>(t)]; }
  void count_refusal(plane_refusal r) {
    refused[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  }
};

} // namespace af
